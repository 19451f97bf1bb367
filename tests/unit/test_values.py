"""A job row read back from the SQL backends (``backends.values.row_from_tuple``)."""

from __future__ import annotations

import dataclasses

from celery_idem.backends.values import ROW_COLUMNS, JobRow, row_from_tuple
from celery_idem.states import State

ROW = (7, "SUCCEEDED", 2, "fp", "tid", None, None, '{"b": 1, "a": 2}', None, "[1, 2.5]",
       '{"note": "x"}')


def test_the_columns_read_back_are_the_rows_fields_in_order():
    assert ROW_COLUMNS == tuple(f.name for f in dataclasses.fields(JobRow))


def test_a_row_that_stood_in_the_way_has_its_json_parsed():
    row = row_from_tuple(ROW)
    assert (row.id, row.state, row.attempt, row.fingerprint) == (7, State.SUCCEEDED, 2, "fp")
    assert (row.result, row.args, row.kwargs) == ({"b": 1, "a": 2}, [1, 2.5], {"note": "x"})
    assert list(row.result) == ["b", "a"]  # the stored order


def test_a_won_rows_result_error_and_arguments_are_not_read():
    row = row_from_tuple(ROW, won=True)
    assert (row.id, row.state, row.attempt) == (7, State.SUCCEEDED, 2)
    assert (row.result, row.error, row.args, row.kwargs) == (None, None, None, None)
