"""The mapping space: closed-form counts against explicit enumeration, against CP-SAT's own
solution count (an independent encoding of the skeleton rules), and the published counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import cp_sat_solution_count, plain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

from costmodel.space.dimensions import DIMENSIONS
from costmodel.inputs.mapping import check_mapping_fits
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.cli.app import cli
from solver.space.count import count_mappings
from solver.space.declaration import SPACES, Space, get_space
from solver.space.enumerate import enumerate_all, iter_chunks, plan

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "problems" / "models"


def make_system(num_networks: int = 2, offload: bool = True) -> System:
    """A minimal system: only the number of networks and the offload tier matter to counting."""
    networks = [dict(name=f"net{i}", size=8 * 64**i, bandwidth_gbps=100.0, efficiency=0.8, latency_us=1.0,
                     processor_usage=0.1) for i in range(num_networks)]
    return System.model_validate(dict(
        name="test", compute={"bfloat16": dict(matrix_tflops=100.0, vector_tflops=10.0,
                                               matrix_efficiency=[[0, 1.0]], vector_efficiency=[[0, 1.0]])},
        hbm=dict(capacity_gib=80, bandwidth_gbps=2000), networks=networks,
        offload=dict(capacity_gib=512, bandwidth_gbps=100) if offload else None))


def gpt_1t(blocks: int) -> Model:
    return Model(name=f"gpt-1t-{blocks}b", hidden=18432, feedforward=73728, seq_size=8192, attn_heads=256,
                 attn_size=72, num_blocks=blocks)


# ---------------------------------------------------------------- the published counts
@pytest.mark.parametrize("blocks, space, expected", [
    (256, "calculon-2023", 15_612_832), (254, "calculon-2023", 842_080),
    # `full` with hybrid sharding and cp_comm (p2p | all_gather | a2a where cp > 1): the p2p share
    # is the count before cp_comm joined (4,593,417,504 / 3,471,442,272 with hybrid sharding),
    # and each of all_gather and a2a adds every mapping with cp > 1 again (that count less the
    # cp = 1 ones, 293,987,456 / 237,225,792); the whole-group (shard = all) share is the count
    # before hybrid sharding (2,965,720,640 / 2,325,257,088)
    (256, "full", 13_192_277_600), (254, "full", 9_939_875_232),
    # Calculon's current enumeration: what `full` counted before ZeRO-2/3 and ZB-H1
    (256, "calculon-current", 23_311_328), (254, "calculon-current", 1_260_992),
])
def test_published_counts(blocks: int, space: str, expected: int) -> None:
    result = count_mappings(gpt_1t(blocks), make_system(), 4096, 3072, get_space(space))
    assert result.mappings == expected
    for name, values in result.by_dimension.items():
        assert sum(values.values()) == expected, name


@pytest.mark.parametrize("blocks, expected", [(256, 15_612_224), (254, 841_472)])
def test_published_counts_without_batch_quirk(blocks: int, expected: int) -> None:
    strict = dataclasses.replace(SPACES["calculon-2023"], batch_is_dp_above_cap=False)
    assert count_mappings(gpt_1t(blocks), make_system(), 4096, 3072, strict).mappings == expected


def test_model_files_match_the_brief() -> None:
    from costmodel.inputs.load import load_model

    for blocks in (256, 254):
        model = load_model(MODELS / f"gpt-1t-{blocks}b.yaml")
        assert model.model_dump(exclude={"name"}) == gpt_1t(blocks).model_dump(exclude={"name"})


def test_full_space_enumerates_exactly_its_count() -> None:
    p = plan(gpt_1t(254), make_system(), 4096, 3072, SPACES["full"], chunk_rows=100_000)
    assert p.total == 9_939_875_232
    assert max(c.rows for c in p.chunks) <= 100_000
    ordinals = [c.ordinal for c in p.chunks]
    assert ordinals == sorted(ordinals) and ordinals[0] == 0


# ---------------------------------------------------------------- small random problems
MOE_SHAPES = ({}, {"num_experts": 4, "experts_per_token": 2, "expert_feedforward": 4},
              {"num_experts": 6, "experts_per_token": 1, "expert_feedforward": 2})
"""Dense (ep = 1 only), and two mixture-of-experts shapes whose expert counts give ep room."""


@st.composite
def small_problems(draw):
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    model = Model(hidden=heads * draw(st.sampled_from([1, 2, 4])), feedforward=draw(st.sampled_from([4, 8, 12, 16])),
                  seq_size=draw(st.sampled_from([1, 2, 3, 8])), attn_heads=heads, attn_size=1,
                  num_blocks=draw(st.integers(1, 12)), **draw(st.sampled_from(MOE_SHAPES)))
    system = make_system(draw(st.integers(1, 3)), draw(st.booleans()))
    num_gpus = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]))
    max_batch = draw(st.integers(1, 24))
    space = draw(st.sampled_from(list(SPACES.values())))
    if draw(st.booleans()):
        space = dataclasses.replace(space, tp_max=draw(st.sampled_from([1, 2, 4])))
    if draw(st.booleans()):
        space = dataclasses.replace(space, cp_max=draw(st.sampled_from([1, 2, 4])))
    # the K/V ring and the whole group only (cp > 1 mappings would come three times over, ZeRO
    # >= 1 ones once per shard group): their counts are the declaration walk's below and
    # tests/test_cp_comm.py's, tests/test_hybrid_sharding.py's
    return model, system, num_gpus, max_batch, plain(space)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_closed_form_equals_enumeration(problem) -> None:
    """Chunk by chunk (a draw may hold tens of millions of mappings: one array of them all took
    gigabytes), the enumeration holds exactly the closed form's count and per-value breakdown,
    in strictly increasing order, each mapping valid."""
    model, system, num_gpus, max_batch, space = problem
    counted = count_mappings(model, system, num_gpus, max_batch, space)
    key = ["tp", "cp", "ep", "etp", "pp", "interleaving", "microbatch"] + [d.name for d in space.flags]
    rows, previous = 0, None
    seen: dict[str, dict[int, int]] = {}
    for _, arrays in iter_chunks(model, system, num_gpus, max_batch, space, chunk_rows=1 << 18):
        _check_order_and_validity(arrays, key, previous, model, system, max_batch, space)
        previous = np.array([arrays.columns[k][-1] for k in key], dtype=np.int32)
        rows += len(arrays)
        for name in counted.by_dimension:
            codes, counts = np.unique(getattr(arrays, name).astype(np.int64), return_counts=True)
            for code, count in zip(codes.tolist(), counts.tolist()):
                seen.setdefault(name, {})[code] = seen.get(name, {}).get(code, 0) + count
    assert counted.mappings == rows
    # Each dimension's breakdown is what the enumeration holds.
    flags = {d.name: d for d in space.flags}
    for name, values in counted.by_dimension.items():
        dim = flags.get(name)
        codes = sorted(seen.get(name, {}))
        labels = [dim.label_of(c) if dim is not None else str(c) for c in codes]
        assert dict(zip(labels, (seen[name][c] for c in codes))) == values, name


def _check_order_and_validity(arrays, key: list[str], previous, model, system, max_batch: int, space) -> None:
    """Enumeration order is strictly lexicographic in (tp, cp, ep, etp, pp, interleaving,
    microbatch, flags...): each row's key exceeds the one before (the previous chunk's last
    too), so no mapping comes twice; and a few rows are valid Mappings that fit."""
    ordered = np.column_stack([arrays.columns[k].astype(np.int32) for k in key])   # codes are small
    if previous is not None:
        ordered = np.vstack([previous[None, :], ordered])
    step = np.diff(ordered, axis=0)
    changed = step != 0
    assert changed.any(axis=1).all(), "enumeration repeats a mapping"
    first_change = np.argmax(changed, axis=1)
    assert (step[np.arange(len(step)), first_change] > 0).all(), "enumeration out of order"
    for i in range(0, len(arrays), max(1, len(arrays) // 7)):
        mapping = arrays.to_mapping(i, Datatype.bfloat16)
        check_mapping_fits(model, system, mapping)
        assert mapping.batch_size <= max(max_batch, mapping.dp if space.batch_is_dp_above_cap else 0)


# ---------------------------------------------------------------- CP-SAT's own count
def cp_sat_count(model: Model, system: System, num_gpus: int, max_batch: int, space: Space) -> int:
    """Count mappings with CP-SAT: the skeleton rules written again as constraints from the
    brief's wording, the flags read from the Space declaration."""
    m = cp_model.CpModel()
    tp = m.NewIntVar(1, min(num_gpus, space.tp_max), "tp")
    cp = m.NewIntVar(1, min(num_gpus, space.cp_max), "cp")
    pp = m.NewIntVar(1, num_gpus, "pp")
    dp = m.NewIntVar(1, num_gpus, "dp")
    m.AddMultiplicationEquality(num_gpus, [tp, cp, pp, dp])     # tp·cp·pp·dp = N
    cp_is_1 = m.NewBoolVar("cp_is_1")
    m.Add(cp == 1).OnlyEnforceIf(cp_is_1)
    m.Add(cp != 1).OnlyEnforceIf(cp_is_1.Not())
    two_cp = m.NewIntVar(2, 2 * num_gpus, "two_cp")
    m.Add(two_cp == 2 * cp)
    seq_mod = m.NewIntVar(0, 2 * num_gpus, "seq_mod_2cp")
    m.AddModuloEquality(seq_mod, model.seq_size, two_cp)
    m.Add(seq_mod == 0).OnlyEnforceIf(cp_is_1.Not())            # 2·cp divides seq when cp > 1
    dp_cp = m.NewIntVar(1, num_gpus, "dp_cp")
    m.AddMultiplicationEquality(dp_cp, [dp, cp])
    # ep divides num_experts, etp expert_feedforward (both 1 for a dense model), and ep·etp
    # divides tp·cp·dp (MoE parallel folding: Megatron-LM's expert rank generator)
    experts = [e for e in range(1, num_gpus + 1) if model.num_experts and model.num_experts % e == 0] or [1]
    widths = [x for x in range(1, min(num_gpus, space.tp_max) + 1)
              if model.num_experts and model.expert_feedforward % x == 0] or [1]
    ep = m.NewIntVarFromDomain(cp_model.Domain.FromValues(experts), "ep")
    etp = m.NewIntVarFromDomain(cp_model.Domain.FromValues(widths), "etp")
    ep_etp = m.NewIntVar(1, num_gpus * num_gpus, "ep_etp")
    m.AddMultiplicationEquality(ep_etp, [ep, etp])
    stage = m.NewIntVar(1, num_gpus, "tp_cp_dp")
    m.AddMultiplicationEquality(stage, [tp, dp_cp])
    m.AddModuloEquality(0, stage, ep_etp)
    for size in (model.hidden, model.attn_heads, model.feedforward):
        m.AddModuloEquality(0, size, tp)                          # tp divides hidden, heads, feedforward
    # pp divides blocks: a stage's share is blocks/pp; or, where the space allows uneven
    # stages, pp > 2 divides blocks + 2, each stage's share (blocks + 2)/pp >= 2 (the first
    # and the last hold one block fewer); or, where pp divides neither, a short last chunk:
    # pp·interleaving chunks of c = ⌈blocks/(pp·interleaving)⌉ blocks, the last short by the
    # excess, which is at most c (less than c without interleaving: a stage holds a block)
    blocks = model.num_blocks
    even, padded, short = (m.NewBoolVar(name) for name in ("even_stages", "padded_stages", "short_last_chunk"))
    m.AddExactlyOne([even, padded, short])
    share = m.NewIntVar(1, blocks + 2, "stage_share")
    m.AddMultiplicationEquality(blocks, [pp, share]).OnlyEnforceIf(even)
    m.AddMultiplicationEquality(blocks + 2, [pp, share]).OnlyEnforceIf(padded)
    m.Add(pp >= 3).OnlyEnforceIf(padded)
    m.Add(share >= 2).OnlyEnforceIf(padded)
    # what pp divides, as a table over its values: uneven only where even is impossible, a
    # short last chunk only where pp > 2 does not divide blocks + 2 either
    even_possible, padded_possible = m.NewBoolVar("pp_divides_blocks"), m.NewBoolVar("pp_above_2_divides_blocks_plus_2")
    m.AddAllowedAssignments([pp, even_possible, padded_possible],
                            [(p, int(blocks % p == 0), int(p > 2 and (blocks + 2) % p == 0))
                             for p in range(1, num_gpus + 1)])
    m.Add(even == even_possible)
    m.AddImplication(padded, padded_possible)
    m.AddImplication(short, padded_possible.Not())
    if not space.uneven_stages:
        m.Add(even == 1)
    interleaving = m.NewIntVar(1, model.num_blocks + 2, "interleaving")
    m.AddModuloEquality(0, share, interleaving)                   # interleaving divides the share
    m.Add(share == interleaving).OnlyEnforceIf(short)             # (no share: any interleaving the chunks allow)
    # (the chunk variables are fixed where the chunks are not short: one solution per mapping)
    virtual = m.NewIntVar(1, num_gpus * (blocks + 2), "virtual_stages")
    m.AddMultiplicationEquality(virtual, [pp, interleaving]).OnlyEnforceIf(short)
    chunk = m.NewIntVar(1, blocks + 2, "chunk_blocks")
    filled = m.NewIntVar(1, num_gpus * (blocks + 2) ** 2, "chunks_times_blocks")
    m.AddMultiplicationEquality(filled, [chunk, virtual]).OnlyEnforceIf(short)
    m.Add(filled >= blocks).OnlyEnforceIf(short)                  # c = ⌈blocks/(pp·interleaving)⌉
    m.Add(filled - virtual <= blocks - 1).OnlyEnforceIf(short)
    m.Add(filled - blocks <= chunk).OnlyEnforceIf(short)          # the excess fits in the last chunk
    for fixed in (virtual, chunk, filled):
        m.Add(fixed == 1).OnlyEnforceIf(short.Not())
    pp_is_1 = m.NewBoolVar("pp_is_1")
    m.Add(pp == 1).OnlyEnforceIf(pp_is_1)
    m.Add(pp != 1).OnlyEnforceIf(pp_is_1.Not())
    m.Add(interleaving == 1).OnlyEnforceIf(pp_is_1)               # no interleaving without a pipeline
    one_chunk = m.NewBoolVar("interleaving_is_1")
    m.Add(interleaving == 1).OnlyEnforceIf(one_chunk)
    m.Add(interleaving != 1).OnlyEnforceIf(one_chunk.Not())
    m.Add(filled - blocks <= chunk - 1).OnlyEnforceIf([short, one_chunk])   # the last stage keeps a block
    replicas_per_cap = m.NewIntVar(0, max_batch, "cap_div_dp")
    m.AddDivisionEquality(replicas_per_cap, max_batch, dp)        # batch = dp·floor(cap/dp)
    local = m.NewIntVar(1, max_batch, "local_batch")
    if space.batch_is_dp_above_cap:
        m.AddMaxEquality(local, [replicas_per_cap, 1])            # quirk: batch = dp when dp > cap
    else:
        m.Add(local == replicas_per_cap)                          # strict: needs dp <= cap
    microbatch = m.NewIntVar(1, max_batch, "microbatch")
    m.AddModuloEquality(0, local, microbatch)                     # microbatch divides the local batch
    tokens = m.NewIntVar(1, max_batch * model.seq_size, "tokens")
    m.Add(tokens == microbatch * model.seq_size)
    tp_cp = m.NewIntVar(1, num_gpus, "tp_cp")
    m.AddMultiplicationEquality(tp_cp, [tp, cp])
    m.AddModuloEquality(0, tokens, tp_cp)                         # microbatch·seq divisible by tp·cp
    subjects = {"tp": tp, "cp": cp, "ep": ep, "etp": etp, "pp": pp, "dp": dp, "dp_cp": dp_cp,
                "offload": int(system.offload is not None)}
    for dim in space.flags:
        domain = dim.domain(len(system.networks))
        if dim.dim.kind == "subgroup":       # 0 (the whole dp·cp) or a smaller power of two dividing it
            domain = tuple(c for c in domain if c < num_gpus)
        var = m.NewIntVarFromDomain(cp_model.Domain.FromValues(list(domain)), dim.name)
        if dim.dim.kind == "subgroup":
            for code in domain[1:]:
                takes = m.NewBoolVar(f"{dim.name}_is_{code}")
                m.Add(var == code).OnlyEnforceIf(takes)
                m.Add(var != code).OnlyEnforceIf(takes.Not())
                m.AddModuloEquality(0, dp_cp, code).OnlyEnforceIf(takes)
                m.Add(dp_cp > code).OnlyEnforceIf(takes)
        holds = []
        for i, cond in enumerate(dim.free_when):
            b = m.NewBoolVar(f"{dim.name}_cond{i}")
            subject = subjects[cond.subject]
            expr = {"==": (subject == cond.value, subject != cond.value),
                    "!=": (subject != cond.value, subject == cond.value),
                    ">": (subject > cond.value, subject <= cond.value)}[cond.op]
            if isinstance(subject, int):                            # a fact of the system
                m.Add(b == int(cond.holds({cond.subject: subject})))
            else:
                m.Add(expr[0]).OnlyEnforceIf(b)
                m.Add(expr[1]).OnlyEnforceIf(b.Not())
            holds.append(b)
        free = m.NewBoolVar(f"{dim.name}_free")
        m.AddBoolAnd(holds).OnlyEnforceIf(free)
        m.AddBoolOr([h.Not() for h in holds] or [m.NewConstant(0)]).OnlyEnforceIf(free.Not())
        m.Add(var == domain[0]).OnlyEnforceIf(free.Not())         # a pinned flag takes its first code
        subjects[dim.name] = var

    return cp_sat_solution_count(m)


# flags: "all" offers every CP communication and shard group; "plain" the K/V ring and the whole
# group only, as before cp_comm and hybrid sharding (cp > 1 mappings would come three times
# over, ZeRO >= 1 ones once per shard group, and CP-SAT lists every mapping)
@pytest.mark.parametrize("hidden, heads, blocks, seq, gpus, cap, networks, offload, experts, flags", [
    pytest.param(8, 4, 6, 8, 8, 8, 1, False, 0, "all", marks=pytest.mark.slow),   # 30 s: CP-SAT lists every mapping
    (12, 6, 4, 3, 6, 5, 1, False, 0, "all"),     # seq 3: microbatch·3 must be divisible by tp
    (8, 8, 8, 1, 4, 3, 2, False, 0, "all"),      # dp = 4 > cap 3: the two spaces differ
    (4, 4, 2, 8, 2, 4, 2, True, 0, "all"),       # offload and two networks
    (8, 8, 6, 4, 6, 4, 1, True, 0, "plain"),      # dp 6 > cap 4 with offload
    pytest.param(8, 4, 4, 8, 4, 4, 1, False, 4, "plain", marks=pytest.mark.slow),  # 8 s: MoE, ep·etp | tp·cp·dp
    (2, 2, 7, 8, 4, 2, 1, False, 0, "plain"),     # 7 blocks: pp 2 and 4 with a short last chunk, interleaved
    (4, 2, 5, 2, 4, 4, 1, False, 0, "plain"),     # 5 blocks: pp 2 (3, 2) and 4 (2, 1, ...: the last stage a block)
    pytest.param(12, 6, 4, 4, 6, 3, 1, True, 6, "all", marks=pytest.mark.slow),  # ep 1, 2, 3, 6; offload
])
def test_closed_form_equals_cp_sat(hidden, heads, blocks, seq, gpus, cap, networks, offload, experts, flags) -> None:
    moe = {"num_experts": experts, "experts_per_token": 2, "expert_feedforward": hidden} if experts else {}
    model = Model(hidden=hidden, feedforward=4 * hidden, seq_size=seq, attn_heads=heads, attn_size=1,
                  num_blocks=blocks, **moe)
    system = make_system(networks, offload)
    for space in SPACES.values():
        space = plain(space) if flags == "plain" else space
        expected = cp_sat_count(model, system, gpus, cap, space)
        assert count_mappings(model, system, gpus, cap, space).mappings == expected


def test_no_mapping_when_dp_exceeds_cap_in_full_space() -> None:
    model = Model(hidden=8, feedforward=32, seq_size=8, attn_heads=8, attn_size=1, num_blocks=1)
    system = make_system(1, False)
    # tp must be 1 or divide 8 and pp = 1 (one block), so dp >= 64/8 = 8 > cap 4.
    assert count_mappings(model, system, 64, 4, SPACES["full"]).mappings == 0
    assert count_mappings(model, system, 64, 4, SPACES["calculon-2023"]).mappings > 0
    assert len(enumerate_all(model, system, 64, 4, SPACES["full"])) == 0


def test_unknown_space_names_the_presets() -> None:
    with pytest.raises(Exception, match="calculon-2023"):
        get_space("nope")


# ---------------------------------------------------------------- CLI
def write_system(tmp_path: Path) -> Path:
    path = tmp_path / "system.json"
    path.write_text(make_system(2, True).model_dump_json())
    return path


def test_cli_count_json_reproduces_published_count(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["count", "--model", str(MODELS / "gpt-1t-254b.yaml"), "--system",
                                      str(write_system(tmp_path)), "--gpus", "4096", "--space", "calculon-2023",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["mappings"] == 842_080
    assert sum(data["by_dimension"]["tp"].values()) == 842_080
    assert "feasible" not in data


def test_cli_count_table(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["count", "--model", str(MODELS / "gpt-1t-256b.yaml"), "--system",
                                      str(write_system(tmp_path)), "--gpus", "4096", "--max-batch", "3072"])
    assert result.exit_code == 0, result.output   # the cap pinned: 13.2 billion at 3,072 (cp_comm, shard)
    assert "13,192,277,600" in result.output and "microbatch" in result.output


@pytest.mark.parametrize("gpus", ["0", "-4", "many"])
def test_cli_count_bad_gpus_is_a_usage_error(tmp_path: Path, gpus: str) -> None:
    result = CliRunner().invoke(cli, ["count", "--model", str(MODELS / "gpt-1t-256b.yaml"), "--system",
                                      str(write_system(tmp_path)), "--gpus", gpus])
    assert result.exit_code == 2
    assert "--gpus" in result.output and "Traceback" not in result.output


def test_cli_count_missing_model_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["count", "--model", str(tmp_path / "none.yaml"), "--system",
                                      str(write_system(tmp_path)), "--gpus", "8"])
    assert result.exit_code == 1
    assert "none.yaml" in result.output and "Traceback" not in result.output


def test_cli_spaces_lists_every_dimension() -> None:
    result = CliRunner().invoke(cli, ["spaces", "--json"])
    assert result.exit_code == 0, result.output
    described = {s["name"]: s for s in json.loads(result.output)}
    assert set(described) == set(SPACES)
    for space in described.values():
        names = [d["name"] for d in space["dimensions"]]
        assert names[:9] == ["tp", "cp", "ep", "etp", "pp", "dp", "batch", "interleaving", "microbatch"]
        assert {"recompute", "tp_overlap", "seq_par_ag_redo", "dp_net"} <= set(names)
    overlap = {n: next(d for d in s["dimensions"] if d["name"] == "tp_overlap")["domain"] for n, s in described.items()}
    assert overlap == {"full": "none | ring | pipe", "calculon-current": "none | ring | pipe",
                       "calculon-2023": "none | ring"}
    stages = {n: next(d for d in s["dimensions"] if d["name"] == "zero")["domain"] for n, s in described.items()}
    assert stages == {"full": "0 | 1 | 2 | 3", "calculon-current": "0 | 1", "calculon-2023": "0 | 1"}
    schedules = {n: next(d for d in s["dimensions"] if d["name"] == "sched")["domain"] for n, s in described.items()}
    assert schedules == {"full": "1f1b | zb-h1", "calculon-current": "1f1b", "calculon-2023": "1f1b"}
    table = CliRunner().invoke(cli, ["spaces"])
    assert table.exit_code == 0 and "calculon-2023" in table.output


@pytest.mark.parametrize("name", ["count", "spaces"])
def test_commands_have_help_with_an_example(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output


# ---------------------------------------------------------------- walking the declaration
def test_every_declared_dimension_agrees_in_count_enumeration_and_cp_sat():
    """For every dimension of costmodel.space.dimensions and every value it takes, the closed-form
    count, the enumeration and the solver's own CP-SAT model (its named constraints, with
    that one dimension pinned) count the same mappings; and each dimension has its column in
    the arrays, the CSV and the report."""
    from solver.report.tables import MAPPING_HEADERS
    from solver.search.brute import CSV_HEADER
    from solver.search.cpsat.constraints import STRUCTURE, Problem
    from solver.search.cpsat.variables import Variables
    from solver.space.declaration import skeletons
    from solver.study.store import CSV_COLUMNS

    model = Model(hidden=512, feedforward=2048, seq_size=256, attn_heads=8, attn_size=64, num_blocks=4)
    moe = model.model_copy(update={"num_experts": 4, "experts_per_token": 2, "expert_feedforward": 512})
    system = make_system()
    # tp, pp, dp up to 2 on 2 networks with offload; the second has dp 2 > cap 1 (batch = dp
    # quirk); the third, a mixture-of-experts model, takes ep (and its network) up to 2 (without
    # offload, which the first covers: 3,476 mappings instead of 5,776, each counted ~50 times);
    # the first and third with the K/V ring and the whole group only (as before cp_comm and
    # hybrid sharding: cp > 1 mappings would come three times over, ZeRO >= 1 ones once per
    # shard group); a fourth, one single-head block on 4 GPUs, one network, no offload and cap 1
    # (462 mappings: dp 1, cp up to 4), walks every cp_comm and shard = 2
    one_head = Model(hidden=64, feedforward=256, seq_size=256, attn_heads=1, attn_size=64, num_blocks=1)
    problems = ((model, system, plain(get_space("full")), 2, 2), (model, system, get_space("calculon-2023"), 2, 1),
                (moe, make_system(offload=False), plain(get_space("full")), 2, 2),
                (one_head, make_system(1, False), get_space("full"), 4, 1))
    for model, system, space, gpus, cap in problems:
        counted = count_mappings(model, system, gpus, cap, space)
        arrays = enumerate_all(model, system, gpus, cap, space)
        assert counted.mappings == len(arrays) > 0
        for dim in DIMENSIONS:
            assert dim.name in arrays.columns and dim.name in counted.by_dimension
            assert dim.name in CSV_COLUMNS and dim.field in CSV_HEADER.split(",")
            assert dim.header in MAPPING_HEADERS or dim.kind in ("switch", "network")
            column = arrays.columns[dim.name].astype(np.int64)
            for value in np.unique(column).tolist():
                label = dim.label_of(value) if dim.is_flag else str(value)
                expected = counted.by_dimension[dim.name][label]
                assert expected == int(np.count_nonzero(column == value)), (dim.name, label)
                m = cp_model.CpModel()
                v = Variables(m, space, skeletons(model, gpus, cap, space), gpus, len(system.networks))
                for constraint in STRUCTURE:
                    constraint.add(m, v, Problem(model, system, gpus, cap, space))
                v.pin(dim.name, value)
                assert cp_sat_solution_count(m) == expected, (space.name, dim.name, label)
