"""Megatron-LM pipeline layout strings (costmodel/terms/pipeline_layout.py) against the layouts
Megatron-Bridge writes out as lists (recipes/deepseek/h100/deepseek_v3.py,
set_deepseek_v3_pipeline_model_parallel_layout), counted by hand."""

import pytest

from costmodel.errors import InputError
from costmodel.space.layout import layout_problem
from costmodel.terms.pipeline_layout import layout_chunks, stage_layout


def test_deepseek_v3_layouts_by_hand():
    # (4, 4): ["embedding"] + 4 decoders, 14 × 4 decoders, 1 decoder + mtp + loss: 16 virtual stages,
    # virtual stage i on rank i mod 4 as its chunk i // 4.
    chunks = layout_chunks("Et*4|(t*4|)*14tmL", 4, 4)
    assert chunks == [[4, 4, 4, 4], [4, 4, 4, 4], [4, 4, 4, 4], [4, 4, 4, 1]]
    assert sum(map(sum, chunks)) == 61                                   # DeepSeek-V3's blocks
    assert stage_layout("Et*4|(t*4|)*14tmL", 4, 4) == (16, 13)
    assert stage_layout("Et*4|(t*4|)*14tmL", 8, 2) == (8, 5)
    assert stage_layout("Et*4|(t*4|)*14tmL", 16, 1) == (4, 1)
    # (8, 1): ["embedding"] + 8, 6 × 8, 5 + mtp + loss
    assert stage_layout("Et*8|(t*8|)*6t*5mL", 8, 1) == (8, 5)
    # 25.09's H100 layout: a first chunk of 1 block and an empty last chunk (the MTP module and the loss)
    assert layout_chunks("Et|(tt|)*30mL", 8, 4)[0] == [1, 2, 2, 2]
    assert stage_layout("Et|(tt|)*30mL", 8, 4) == (7, 6)


def test_expressed_layouts_are_valid_mappings_and_others_are_not_expressed():
    for layout, pp, v in (("Et*4|(t*4|)*14tmL", 4, 4), ("Et*4|(t*4|)*14tmL", 8, 2), ("Et|(tt|)*30mL", 8, 4)):
        first, last = stage_layout(layout, pp, v)
        assert layout_problem(61, pp, v, first, last) is None
    # a middle stage unlike the others, or a short chunk in the middle of a stage: not expressed
    assert stage_layout("Et*2|t*3|t*2|t*2mL", 4, 1) is None
    assert stage_layout("Et*2|t*2|t*2|t*2|t*2|t*2|t*1|t*2L", 4, 2) is None


@pytest.mark.parametrize("layout, fragment", [
    ("Et*4|(t*4|)*14tmL", "16 virtual stages, not pp(4) × vp(2) = 8"),
    ("Et*4|x*4|t*4|tL", "unknown layer(s) x"),
    ("Et*4|(t*4|*14tmL", "a repetition that does not parse"),
])
def test_a_layout_that_does_not_parse_names_itself(layout, fragment):
    with pytest.raises(InputError, match=r"pipeline_layout .*" + fragment.replace("(", r"\(").replace(")", r"\)")
                       .replace("*", r"\*")):
        layout_chunks(layout, 4, 2 if "14" in layout else 1)


@pytest.mark.parametrize("layout", ["(t*2|)*999999999", "((((t*999)*999)*999)*999)", "t*" + "9" * 40,
                                    "(" * 50 + "t" + ")*99" * 50])
def test_a_layout_that_expands_past_any_model_is_refused_before_it_is_written(layout):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match=r"pipeline_layout .*more than 4,194,304"):
        layout_chunks(layout, 2, 1)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000     # KiB: under 100 MB
