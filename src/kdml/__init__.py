"""kdml: kernel-regularized deep metric learning (JRD, Atlas, DTML)."""

__version__ = "0.1.0"
