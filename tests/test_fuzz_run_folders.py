"""Run folders and the files the reading commands write, under a user's mishaps, as a fuzzing
session found them mishandled."""

from __future__ import annotations

import json

import pytest

from kdml.cli.evaluate import EVAL_FIELDS
from kdml.errors import KdmlError
from kdml.inspection.analysis import GENERALIZATION_FIELDS
from kdml.training.run_folder import METRICS_FIELDS, write_json


@pytest.mark.parametrize("fields, mine, older_kdml", [
    (EVAL_FIELDS, {"metrics": {"recall@1": 0.99}, "source": "paper, Table 2, transcribed"},
     {"epoch": 2, "metrics": {"recall@1": 0.5}}),
    (METRICS_FIELDS, {"final": "v3", "notes": "my own"},
     {"epochs": [], "final": {"recall@1": 0.5}}),
    (GENERALIZATION_FIELDS, {"settings": {"lr": 0.1}},
     {"settings": {}, "h_divergence": {}, "lambda": {}}),
], ids=["eval.json", "metrics.json", "generalization.json"])
def test_a_users_json_that_shares_a_field_with_kdmls_is_not_replaced(tmp_path, fields, mine,
                                                                      older_kdml):
    """A user's own file under a name kdml writes, sharing one field with kdml's (a "metrics"
    key, say), had been taken for kdml's and replaced (kdml eval's eval.json); one with every
    field kdml has always written there is kdml's, an older version's too (without the
    fields added since, "checkpoint" and "scored"), and is replaced."""
    path = tmp_path / "result.json"
    path.write_text(json.dumps(mine))
    ours = {**dict.fromkeys(fields, 1), "scored": "test"}
    with pytest.raises(KdmlError, match="is in the way and kdml did not write it"):
        write_json(ours, path, fields)
    assert json.loads(path.read_text()) == mine
    path.write_text(json.dumps(older_kdml))
    write_json(ours, path, fields)
    assert json.loads(path.read_text()) == ours
