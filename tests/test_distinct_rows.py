"""costmodel.ops.distinct_rows packs integer columns as they are and converts the others:
both paths give the same rows, classes and identity on random inputs (narrow integer,
Boolean and whole-number float columns, strided views of a table, and spans wide enough to
take np.unique's path); distinct_table_rows, a table's columns packed together, gives
distinct_rows' answer exactly (same rows, classes and identity), on either path and where it
falls back."""

import numpy as np
import pytest

from costmodel.ops import distinct_rows, distinct_table_rows


@pytest.mark.parametrize("seed", range(6))
def test_integer_columns_as_they_are_equal_converted_ones(seed):
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(1, 3000))
    spans = rng.integers(1, [2, 5, 40, 300, 2 ** 20 if seed % 2 else 9])
    table = np.column_stack([rng.integers(0, span, rows) + int(rng.integers(0, 4)) for span in spans]).astype(np.int32)
    columns = [table[:, j] for j in range(table.shape[1])] + [table[:, 0] % 2 == 1]
    fast = distinct_rows(columns)
    plain = distinct_rows([column.astype(np.float64) for column in columns])
    np.testing.assert_array_equal(fast[1], plain[1])
    np.testing.assert_array_equal(fast[1][fast[0]], np.arange(len(fast[0])))
    for j, column in enumerate(columns):          # each row's class holds its own values
        np.testing.assert_array_equal(column[fast[0]][fast[1]], column)
    assert fast[2] == plain[2]


def test_wide_spans_take_unique_rows_alike():
    rng = np.random.default_rng(7)
    columns = [rng.integers(0, 2 ** 40, 500), rng.integers(0, 2 ** 30, 500).astype(np.uint32)]
    fast, plain = distinct_rows(columns), distinct_rows([column.astype(np.float64) for column in columns])
    np.testing.assert_array_equal(fast[1], plain[1])
    assert fast[2] == plain[2]


@pytest.mark.parametrize("seed", range(8))
def test_a_tables_columns_packed_together_equal_distinct_rows(seed):
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(1, 5000))
    spans = rng.integers(1, [2, 3, 5, 9, 40, 1100, 2 ** 12 if seed % 2 else 3])
    table = np.column_stack([rng.integers(0, span, rows) + int(rng.integers(0, 4)) for span in spans]).astype(np.int32)
    wide = np.column_stack([table, rng.integers(0, 2 ** 30, rows)]).astype(np.int32)   # int32 cannot hold its key
    for source, columns in ((table, (0, 1, 3, 4, 6)), (table, (5,)), (table, tuple(range(table.shape[1]))),
                            (table, (2, 0)), (wide, (6, 7, 5))):
        packed, each = distinct_table_rows(source, columns), distinct_rows([source[:, j] for j in columns])
        np.testing.assert_array_equal(packed[0], each[0])
        np.testing.assert_array_equal(packed[1], each[1])
        assert packed[0].dtype == each[0].dtype and packed[1].dtype == each[1].dtype
        assert packed[2] == each[2]
