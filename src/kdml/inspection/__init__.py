"""Looking at a trained run: its embeddings of a split (``kdml embed``), a search index of them
(``kdml index``), queries against that index (``kdml search``), pictures (``kdml plot
retrieval``, ``kdml plot embedding``, ``kdml plot charts``) and the generalization terms
(``kdml analyze generalization``). The command line and ``kdml reproduce`` call these; they
return data and write files, and print nothing.

- :mod:`~kdml.inspection.parts`: the part of a run's data a command looks at; ``embed``, ``index``;
- :mod:`~kdml.inspection.queries`: a search's queries as vectors;
- :mod:`~kdml.inspection.search`: ``search``, with neither the run's data nor (for stored
  vectors) its model;
- :mod:`~kdml.inspection.plots`: ``plot retrieval``, ``plot embedding``, ``plot charts``;
- :mod:`~kdml.inspection.analysis`: ``analyze generalization``.
"""
