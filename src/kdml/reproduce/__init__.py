"""Reproduce the papers' experiments on the offline data: ``kdml reproduce`` (see the
modules: experiments, catalog, runner, report, plots)."""
