"""Generated bad input (issue 19): every malformed file and unreadable path is answered with
exit status 2 and one line on stderr naming the file and the field, never a traceback or a
hang; the valid inputs they are mutated from exit 0; `optimize --json` is the same bytes twice.

Hypothesis draws the mutations: a numeric field of a zoo TOML, a cluster file (GPU table and
tiers), a Hugging Face config.json, a plan file, a calibration profile, an nccl-tests row or a
sweep results line set to a value it cannot hold (a boolean, a string, nan, infinities, 1e999,
a 30-digit or a 5,000-digit integer, a fraction, a list, a table, arrays nested 5,000 deep), and
paths that are missing, folders, /dev/zero, /proc/self/mem, not UTF-8 or empty. Issue 37 adds
model names an engine would read as options, the optional fields of a results line, duplicate
JSON keys and tier names, nccl-tests rows flagged #wrong or faster than the GPU's links, an FP4
KV cache below Blackwell, names holding markup or formulas (shown as written), and hostile
names, sizes and files (a model name outside the zoo or 5,000 characters long, a kernel_table
path, a length file that never ends or holds '²', a sweep of 20,000 problems, `sweep -o` on a
file that is not a results file, which must stay byte-identical). Each case runs in-process
through click's CliRunner under a time limit (tests/bad_input.py). Derandomized and bounded:
about 1,000 cases, under a minute. The numeric flags: tests/test_bad_flags_generated.py.
"""
from __future__ import annotations

import csv
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bad_input import (
    BAD_FLOAT_JSON,
    BAD_FLOAT_TOML,
    BAD_INTEGER_JSON,
    BAD_INTEGER_TOML,
    BAD_OPTIONAL_RESULT_FIELDS,
    BASE_ARGS,
    GENERATED,
    MARKUP_NAMES,
    NCCL_LOG,
    OPTION_LIKE_NAMES,
    PARSE_ERRORS,
    ROOT,
    assert_ok,
    assert_one_line_error,
    invoke,
)

HF_CONFIG = ROOT / "tests" / "data" / "hf_configs" / "mixtral-8x7b-v0.1.json"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-input")


# ---- files: TOML ------------------------------------------------------------------------------

def numeric_lines(text: str, kinds: tuple[type, ...]) -> list[int]:
    """Indexes of the `key = number` lines of a TOML text whose number is of `kinds`."""
    found = []
    for index, line in enumerate(text.splitlines()):
        match = re.match(r"^([a-z_0-9]+) = (\S+)$", line)
        if match:
            value = json.loads(match.group(2)) if re.match(r"^-?[\d.e+-]+$", match.group(2)) \
                else None
            if isinstance(value, kinds) and not isinstance(value, bool):
                found.append(index)
    return found


def mutate_line(text: str, index: int, value: str) -> tuple[str, str]:
    """The text with line `index` set to `value`, and the line's key."""
    lines = text.splitlines()
    key = lines[index].split(" = ")[0]
    lines[index] = f"{key} = {value}"
    return "\n".join(lines) + "\n", key


def cluster_file_text() -> str:
    """dgx-h100 with its GPU table embedded, so that both can be mutated."""
    preset = (ROOT / "clusters" / "presets" / "dgx-h100.toml").read_text(encoding="utf-8")
    gpu = (ROOT / "clusters" / "gpus" / "h100-sxm.toml").read_text(encoding="utf-8")
    gpu_lines = [line for line in gpu.splitlines() if re.match(r"^[a-z_0-9]+ = ", line)]
    return preset.replace('gpu = "h100-sxm"\n', "") + "\n[gpu]\n" + "\n".join(gpu_lines) + "\n"


MODEL_TEXTS = {name: (ROOT / "models" / f"{name}.toml").read_text(encoding="utf-8")
               for name in ("llama3.2-1b", "mixtral-8x7b", "deepseek-v2-lite")}
CLUSTER_TEXT = cluster_file_text()


@GENERATED
@given(data=st.data(), base=st.sampled_from(sorted(MODEL_TEXTS)),
       value=st.sampled_from(BAD_INTEGER_TOML))
def test_a_bad_number_in_a_model_file_is_one_line(work: Path, data: st.DataObject, base: str,
                                                  value: str) -> None:
    text = MODEL_TEXTS[base]
    index = data.draw(st.sampled_from(numeric_lines(text, (int,))))
    mutated, key = mutate_line(text, index, value)
    path = work / f"{base}-mutated.toml"
    path.write_text(mutated, encoding="utf-8")
    needles = [str(path)] if value in PARSE_ERRORS else [str(path), f"'{key}'"]
    assert_one_line_error(invoke("models", "show", path), *needles)


@GENERATED
@given(data=st.data())
def test_a_bad_number_in_a_cluster_file_is_one_line(work: Path, data: st.DataObject) -> None:
    index = data.draw(st.sampled_from(numeric_lines(CLUSTER_TEXT, (int, float))))
    is_int = isinstance(json.loads(CLUSTER_TEXT.splitlines()[index].split(" = ")[1]), int)
    value = data.draw(st.sampled_from(BAD_INTEGER_TOML if is_int else BAD_FLOAT_TOML))
    mutated, key = mutate_line(CLUSTER_TEXT, index, value)
    path = work / "cluster-mutated.toml"
    path.write_text(mutated, encoding="utf-8")
    needles = [str(path)] if value in PARSE_ERRORS else [str(path), key]
    assert_one_line_error(invoke("estimate", "--model", "llama3.2-1b", "--cluster", path,
                                 "--gpus", "8", "--json"), *needles)


# ---- files: JSON ------------------------------------------------------------------------------

HF_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "vocab_size", "max_position_embeddings", "num_local_experts",
           "num_experts_per_tok")


@GENERATED
@given(key=st.sampled_from(HF_KEYS), value=st.sampled_from(BAD_INTEGER_JSON))
def test_a_bad_number_in_a_hugging_face_config_is_one_line(work: Path, key: str,
                                                           value: object) -> None:
    config = json.loads(HF_CONFIG.read_text(encoding="utf-8"))
    config[key] = value
    path = work / "mutated" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(config), encoding="utf-8")
    assert_one_line_error(invoke("models", "show", path), str(path), key)


@pytest.fixture(scope="module")
def optimized(work: Path) -> dict:
    """`optimize --json` of llama3.2-1b on 8 GPUs: a plan file and a results line."""
    result = invoke("optimize", "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus",
                    "8", "--top", "2", "--json")
    assert_ok(result)
    return json.loads(result.stdout)


DEGREE_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch")


@GENERATED
@given(key=st.sampled_from(DEGREE_FIELDS + ("zero", "recompute", "plans")),
       value=st.sampled_from(BAD_INTEGER_JSON + (4, "abc")))
def test_a_bad_plan_file_is_one_line(work: Path, optimized: dict, key: str,
                                     value: object) -> None:
    answer = json.loads(json.dumps(optimized))
    if key == "plans":
        answer["plans"] = value if not isinstance(value, list) else [value]
    elif key in DEGREE_FIELDS and value == 4:
        answer["plans"][0][key] = 0
    else:
        answer["plans"][0][key] = value
    path = work / "plan.json"
    path.write_text(json.dumps(answer), encoding="utf-8")
    assert_one_line_error(invoke("launch", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                 "--gpus", "8", "--plan", path, "--format", "megatron"),
                          str(path))


@pytest.fixture(scope="module")
def profile(work: Path) -> Path:
    path = work / "profile.json"
    assert_ok(invoke("calibrate", "nccl-tests", NCCL_LOG, "--cluster", "dgx-h100", "-o", path))
    return path


CURVE_FIELDS = (("num_ranks",), ("num_nodes",), ("num_domains",), ("knots", 0, "time_us"),
                ("knots", 1, "size_bytes"), ("measured", 0, "busbw_gb_per_s"),
                ("measured", 0, "time_us"))


@GENERATED
@given(where=st.sampled_from(CURVE_FIELDS), value=st.sampled_from(BAD_FLOAT_JSON + (10**30,)))
def test_a_bad_calibration_profile_is_one_line(work: Path, profile: Path,
                                               where: tuple, value: object) -> None:
    data = json.loads(profile.read_text(encoding="utf-8"))
    curve = next(iter(next(iter(data["tiers"].values())).values()))
    target = curve
    for step in where[:-1]:
        target = target[step]
    target[where[-1]] = value
    path = work / "profile-mutated.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert_one_line_error(invoke("estimate", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                 "--gpus", "8", "--calibration", path), str(path), where[-1])


NCCL_LINES = NCCL_LOG.read_text(encoding="utf-8").splitlines()
NCCL_ROWS = [i for i, line in enumerate(NCCL_LINES)
             if line.split() and line.split()[0].isdigit()]


@GENERATED
@given(row=st.sampled_from(NCCL_ROWS), data=st.data(),
       value=st.sampled_from(("nan", "inf", "-inf", "1e999", "NaN", "abc", "1e300", "-5")))
def test_a_bad_number_in_an_nccl_tests_log_is_one_line(work: Path, row: int,
                                                       data: st.DataObject, value: str) -> None:
    fields = NCCL_LINES[row].split()  # time, algbw and busbw of both halves
    column = data.draw(st.sampled_from(
        [i for i, field in enumerate(fields) if re.match(r"^\d+\.\d+$", field)]))
    fields[column] = value
    lines = list(NCCL_LINES)
    lines[row] = "  ".join(fields)
    path = work / "all_reduce_mutated.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert_one_line_error(invoke("calibrate", "nccl-tests", path, "--cluster", "dgx-h100", "-o",
                                 work / "p.json"), str(path), f"line {row + 1}")


RESULT_KEYS = ("model", "cluster", "gpus", "seq_len", "global_batch", "precision", "status",
               "plans")
PLAN_KEYS = ("tp", "pp", "zero", "micro_batch", "memory_gb", "step_seconds", "mfu",
             "gpu_memory_gb", "tokens_per_second")


@GENERATED
@given(key=st.sampled_from(RESULT_KEYS + tuple(f"plans.0.{k}" for k in PLAN_KEYS)),
       value=st.sampled_from((True, "abc", math.nan, 10**30, [1], {"a": 1}, None, -3)))
def test_a_damaged_results_file_is_one_line_naming_the_line(work: Path, optimized: dict,
                                                            key: str, value: object) -> None:
    lines = [optimized, {**optimized, "gpus": 16, "status": "error", "error": "x", "plans": []}]
    line = json.loads(json.dumps(optimized))
    if key.startswith("plans.0."):
        line["plans"][0][key.split(".")[-1]] = value
    elif not (key in ("model", "cluster", "precision", "status") and value == "abc"):
        line[key] = value
    else:
        line[key] = 5
    path = work / "results.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in (lines[0], line, lines[1])),
                    encoding="utf-8")
    assert_one_line_error(invoke("report", path, "-o", work / "report", "--no-plots"),
                          f"{path}:2", key.split(".")[0])


# ---- paths ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_paths(work: Path) -> dict[str, Path]:
    folder = work / "paths"
    folder.mkdir()
    paths = {"missing": folder / "missing", "folder": folder / "a-folder", "zero": folder / "zero",
             "latin1": folder / "latin1", "empty": folder / "empty", "mem": folder / "mem"}
    paths["folder"].mkdir()
    paths["latin1"].write_bytes(b"name = \"caf\xe9\"\n")
    paths["empty"].write_bytes(b"")
    if Path("/dev/zero").exists():
        paths["zero"].symlink_to("/dev/zero")
    if Path("/proc/self/mem").exists():  # a regular file whose read fails (EIO)
        paths["mem"].symlink_to("/proc/self/mem")
    return paths


PATH_USES = {
    "model": lambda p: ["models", "show", f"{p}.toml" if p.name != "a-folder" else p],
    "cluster": lambda p: ["estimate", "--model", "llama3.2-1b", "--cluster", f"{p}.toml",
                          "--gpus", "8"],
    "calibration": lambda p: ["estimate", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                              "--gpus", "8", "--calibration", p],
    "plan": lambda p: ["launch", "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus",
                       "8", "--plan", p],
    "log": lambda p: ["calibrate", "nccl-tests", p, "--cluster", "dgx-h100", "-o", f"{p}.out"],
    "results": lambda p: ["report", p, "-o", Path(p).parent / "report"],
}


@GENERATED
@given(use=st.sampled_from(sorted(PATH_USES)),
       kind=st.sampled_from(("missing", "folder", "zero", "latin1", "empty", "mem")))
def test_an_unreadable_path_is_one_line_naming_it(bad_paths: dict[str, Path], use: str,
                                                  kind: str) -> None:
    path = bad_paths[kind]
    if kind in ("zero", "mem") and not path.is_symlink() or use == "results" and kind == "empty":
        return  # no /dev/zero here; an empty results file is an empty report
    args = PATH_USES[use](path)
    if use in ("model", "cluster") and kind in ("zero", "latin1", "empty"):
        target = Path(f"{path}.toml")
        if not target.exists() and not target.is_symlink():
            target.symlink_to(path)
    assert_one_line_error(invoke(*args), path.name)


# ---- issue 37: option-like names, optional results fields, duplicates, nccl-tests rows -------

ISSUE37 = settings(GENERATED, max_examples=25)


def model_named(folder: Path, name: str) -> Path:
    """llama3.2-1b under `name`, without its Hugging Face source (so `name` is its id)."""
    text = MODEL_TEXTS["llama3.2-1b"]
    lines = [line for line in text.splitlines() if not line.startswith(("name =", "source ="))]
    path = folder / "named.toml"
    path.write_text(f"name = {json.dumps(name)}\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


@ISSUE37
@given(name=st.sampled_from(OPTION_LIKE_NAMES) | st.text(
           st.characters(min_codepoint=33, max_codepoint=126), max_size=20).map("-{}".format),
       command=st.sampled_from(("vllm", "torchtitan-python", "serve", "models show")))
def test_an_option_like_model_name_is_one_line(work: Path, name: str, command: str) -> None:
    path = model_named(work, name)
    args = {"serve": ["serve", "--model", path, *BASE_ARGS["serve"][2:]],
            "models show": ["models", "show", path]}.get(
        command, ["launch", "--model", path, *BASE_ARGS["launch"][2:], "--format", command])
    assert_one_line_error(invoke(*args), str(path), "field 'name'", "must not start with '-'")


@ISSUE37
@given(data=st.data(), field=st.sampled_from(BAD_OPTIONAL_RESULT_FIELDS))
def test_a_bad_optional_field_of_a_results_line_is_one_line(work: Path, optimized: dict,
                                                            data: st.DataObject,
                                                            field: tuple) -> None:
    key, in_plan, values = field
    line = json.loads(json.dumps(optimized))
    (line["plans"][0] if in_plan else line)[key] = data.draw(st.sampled_from(values))
    path = work / "results-optional.jsonl"
    path.write_text(json.dumps(optimized) + "\n" + json.dumps({**line, "gpus": 16}) + "\n",
                    encoding="utf-8")
    out = work / "report-optional"
    shutil.rmtree(out, ignore_errors=True)
    assert_one_line_error(invoke("report", path, "-o", out, "--no-plots"), f"{path}:2", key)
    assert not (out / "summary.csv").exists()


def json_with_duplicate(data: dict, key: str) -> str:
    """The object's JSON with `key` written twice (an earlier copy holding null)."""
    return '{"' + key + '": null, ' + json.dumps(data)[1:]


@ISSUE37
@given(kind=st.sampled_from(("plan", "profile", "config", "results")), data=st.data())
def test_a_duplicate_json_key_is_one_line(work: Path, optimized: dict, profile: Path,
                                          kind: str, data: st.DataObject) -> None:
    objects = {"plan": optimized, "results": optimized,
               "profile": json.loads(profile.read_text(encoding="utf-8")),
               "config": json.loads(HF_CONFIG.read_text(encoding="utf-8"))}
    key = data.draw(st.sampled_from(sorted(objects[kind])))
    text = json_with_duplicate(objects[kind], key)
    if kind == "config":
        path = work / "duplicate" / "config.json"
        path.parent.mkdir(exist_ok=True)
    else:
        path = work / f"duplicate-{kind}.json"
    path.write_text(text + "\n", encoding="utf-8")
    args = {"plan": ["launch", *BASE_ARGS["launch"], "--plan", path],
            "profile": ["estimate", *BASE_ARGS["estimate"], "--calibration", path],
            "config": ["models", "show", path],
            "results": ["report", path, "-o", work / "report-duplicate", "--no-plots"]}[kind]
    assert_one_line_error(invoke(*args), str(path), f"'{key}' appears twice")


TIERED_PRESETS = [path for path in sorted((ROOT / "clusters" / "presets").glob("*.toml"))
                  if path.read_text(encoding="utf-8").count("[[tiers]]") >= 2]


@ISSUE37
@given(preset=st.sampled_from(TIERED_PRESETS), data=st.data())
def test_duplicate_tier_names_are_one_line(work: Path, preset: Path, data: st.DataObject) -> None:
    text = preset.read_text(encoding="utf-8")
    names = re.findall(r'\[\[tiers\]\]\nname = "([^"]+)"', text)
    first, second = data.draw(st.lists(st.sampled_from(range(len(names))), min_size=2,
                                       max_size=2, unique=True))
    blocks = text.split("[[tiers]]\n")
    blocks[second + 1] = blocks[second + 1].replace(f'name = "{names[second]}"',
                                                    f'name = "{names[first]}"', 1)
    path = work / "tiers-twice.toml"
    path.write_text("[[tiers]]\n".join(blocks), encoding="utf-8")
    assert_one_line_error(invoke("estimate", "--model", "llama3.2-1b", "--cluster", path,
                                 "--gpus", "8"), str(path), f"'{names[first]}' names more")


def nccl_row_fields(row: int) -> tuple[list[str], list[int], list[int]]:
    """A row's fields and the indexes of its #wrong and busbw columns (both halves)."""
    header = next(line for line in NCCL_LINES if "busbw" in line).lstrip("#").split()
    return (NCCL_LINES[row].split(), [i for i, n in enumerate(header) if n == "#wrong"],
            [i for i, n in enumerate(header) if n == "busbw"])


@ISSUE37
@given(row=st.sampled_from(NCCL_ROWS), data=st.data(),
       kind=st.sampled_from(("#wrong", "busbw")))
def test_a_wrong_or_impossible_nccl_tests_row_is_one_line(work: Path, row: int,
                                                          data: st.DataObject,
                                                          kind: str) -> None:
    """#wrong above 0, or busbw above 900 GB/s (2 x H100 NVLink's 450 per direction)."""
    fields, wrong, busbw = nccl_row_fields(row)
    column = data.draw(st.sampled_from(wrong if kind == "#wrong" else busbw))
    fields[column] = data.draw(st.sampled_from(("1", "7", "1000000") if kind == "#wrong"
                                               else ("900.01", "2000", "1e6")))
    lines = list(NCCL_LINES)
    lines[row] = "  ".join(fields)
    path = work / "all_reduce_flagged.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert_one_line_error(invoke("calibrate", "nccl-tests", path, "--cluster", "dgx-h100", "-o",
                                 work / "p.json"), str(path), f"line {row + 1}", f"'{kind}'")


@ISSUE37
@given(value=st.sampled_from(("²", "½", "٣", "1e3", "0x10", "1_000")) | st.text(
           st.characters(categories=("Nd", "No")), min_size=1, max_size=3).filter(
           lambda text: not text.isascii()),
       flag=st.sampled_from(("--input-len", "--output-len")))
def test_a_length_file_with_a_non_ascii_number_is_one_line(work: Path, value: str,
                                                           flag: str) -> None:
    path = work / "lengths.txt"
    path.write_text(f"100\n{value}\n", encoding="utf-8")
    assert_one_line_error(invoke("serve", *BASE_ARGS["serve"], flag, f"@{path}"), str(path),
                          "line 2")


@settings(GENERATED, max_examples=8)
@given(cluster=st.sampled_from(("dgx-h100", "dgx-h200", "dgx-a100-80gb", "hgx-h20",
                                "grand-teton-h100")),
       model=st.sampled_from(("llama3.1-8b", "llama3.2-1b", "mixtral-8x7b")))
def test_an_fp4_kv_cache_below_blackwell_is_refused_by_name(cluster: str, model: str) -> None:
    result = invoke("serve", "--model", model, "--cluster", cluster, "--gpus", "8", "--context",
                    "8k", "--kv-cache-dtype", "fp4", "--json")
    assert_ok(result)
    answer = json.loads(result.stdout)
    assert answer["status"] == "infeasible"
    assert "nvfp4_kv_cache_supported" in answer["conflicts"]


@pytest.mark.parametrize("name", MARKUP_NAMES)
def test_a_name_with_markup_or_a_formula_shows_as_written(work: Path, optimized: dict,
                                                          name: str) -> None:
    """Tier and cluster names through rich (launch, calibrate), result names through the
    report's tables, model names through torchtitan-python's module: as text, no error."""
    text = CLUSTER_TEXT.replace('name = "nvlink"', f"name = {json.dumps(name)}")
    cluster = work / "markup-cluster.toml"
    cluster.write_text(text, encoding="utf-8")
    result = invoke("launch", "--model", "llama3.2-1b", "--cluster", cluster, "--gpus", "8",
                    "--tp", "2", "--format", "groups")
    assert_ok(result)
    assert name in result.stdout
    assert_ok(invoke("calibrate", "nccl-tests", NCCL_LOG, "--cluster", cluster, "-o",
                     work / "markup-profile.json"))
    titan = invoke("launch", "--model", model_named(work, name), *BASE_ARGS["launch"][2:],
                   "--format", "torchtitan-python")
    assert_ok(titan)
    compile(titan.stdout, "<torchtitan-python>", "exec")
    lines = [optimized, {**optimized, "cluster": name, "gpus": 16},
             {**optimized, "gpus": 32, "status": "infeasible", "plans": [],
              "conflicts": [name, f"{name}\n{name}"]}]
    path = work / "results-markup.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    out = work / "report-markup"
    assert_ok(invoke("report", path, "-o", out, "--no-plots"))
    with (out / "summary.csv").open(encoding="utf-8", newline="") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@")], cells
    summary = (out / "summary.md").read_text(encoding="utf-8").split("## ")[0]
    assert "<a " not in summary and "<img" not in summary
    assert len([line for line in summary.splitlines() if line.startswith("|")]) == 2 + 3


# ---- hostile names, sizes and files (issue 37) ------------------------------------------------

def hostile_case(work: Path, case: str) -> tuple[list[object], list[str], Path | None]:
    """The arguments of one issue-37 case, the needles of its error line, and a file that
    must be left byte-identical (None: none)."""
    folder = work / "hostile"
    folder.mkdir(exist_ok=True)
    if case.startswith("model "):
        name = {"model ../": "../clusters/presets/dgx-h100", "model long": "m" * 5000}[case]
        return ["estimate", "--model", name, "--cluster", "dgx-h100", "--gpus", "8"], \
            ["unknown model"], None
    if case.startswith("kernel_table "):
        table = {"kernel_table ../": "../../tmp/t", "kernel_table /": "/tmp/t.npz"}[case]
        path = folder / "cluster.toml"
        assert 'kernel_table = "h100_sxm"' in CLUSTER_TEXT
        path.write_text(CLUSTER_TEXT.replace('kernel_table = "h100_sxm"',
                                             f'kernel_table = "{table}"'), encoding="utf-8")
        return ["estimate", "--model", "llama3.2-1b", "--cluster", path, "--gpus", "8"], \
            [str(path), "kernel_table"], None
    if case.startswith("lengths "):
        source = "/dev/zero"
        if case == "lengths superscript":
            source = str(folder / "lengths.txt")
            Path(source).write_text("²\n", encoding="utf-8")
        return ["serve", *BASE_ARGS["serve"], "--input-len", f"@{source}"], \
            ["--input-len", source], None
    if case == "sweep grid":  # small enough to stay bounded in this process if it regresses
        return ["sweep", *BASE_ARGS["sweep"][:4], "--gpus", "1-20000", "-o",
                folder / "r.jsonl"], ["20,000 problems", "--max-problems"], None
    path = folder / "conf.json"  # sweep -o on a file that is not a results file
    path.write_bytes({"sweep -o config": b'{"my": "config"}',
                      "sweep -o binary": bytes(range(256)) * 4}[case])
    return ["sweep", *BASE_ARGS["sweep"], "-o", path], [str(path)], path


HOSTILE_CASES = ("model ../", "model long", "kernel_table ../", "kernel_table /",
                 "lengths /dev/zero", "lengths superscript", "sweep grid", "sweep -o config",
                 "sweep -o binary")


@GENERATED
@given(case=st.sampled_from(HOSTILE_CASES))
def test_a_hostile_name_size_or_output_file_is_one_line(work: Path, case: str) -> None:
    if case == "lengths /dev/zero" and not Path("/dev/zero").exists():
        return
    args, needles, kept = hostile_case(work, case)
    before = kept.read_bytes() if kept is not None else None
    assert_one_line_error(invoke(*args), *needles)
    if kept is not None:
        assert kept.read_bytes() == before


# ---- valid controls and determinism -----------------------------------------------------------

def test_the_unmutated_inputs_are_accepted(work: Path, optimized: dict, profile: Path) -> None:
    for name, text in MODEL_TEXTS.items():
        path = work / f"{name}-control.toml"
        path.write_text(text, encoding="utf-8")
        assert_ok(invoke("models", "show", path))
    cluster = work / "cluster-control.toml"
    cluster.write_text(CLUSTER_TEXT, encoding="utf-8")
    assert_ok(invoke("estimate", "--model", "llama3.2-1b", "--cluster", cluster, "--gpus", "8"))
    assert_ok(invoke("models", "show", HF_CONFIG))
    plan = work / "plan-control.json"
    plan.write_text(json.dumps(optimized), encoding="utf-8")
    assert_ok(invoke("launch", *BASE_ARGS["launch"], "--plan", plan, "--format", "megatron"))
    assert_ok(invoke("estimate", *BASE_ARGS["estimate"], "--calibration", profile))
    results = work / "results-control.jsonl"
    results.write_text(json.dumps(optimized) + "\n", encoding="utf-8")
    assert_ok(invoke("report", results, "-o", work / "report-control", "--no-plots"))
    for path, args in BASE_ARGS.items():
        if path not in ("calibrate run", "sweep", "optimize", "report"):  # report: above
            out = ["-o", str(work / "control-out")] if path.startswith("calibrate") else []
            assert_ok(invoke(*path.split(), *args, *out))


def without_timing(value: object) -> object:
    """The JSON with its timing fields (`solve_seconds`) taken out."""
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k != "solve_seconds"}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def test_optimize_json_is_the_same_bytes_twice_apart_from_timing() -> None:
    args = ["optimize", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
            "--json"]
    first, second = invoke(*args), invoke(*args)
    assert_ok(first)
    assert_ok(second)
    pattern = re.compile(r'^\s*"solve_seconds": [0-9.]+,?\n', re.MULTILINE)
    assert pattern.sub("", first.stdout) == pattern.sub("", second.stdout)
    assert without_timing(json.loads(first.stdout)) == without_timing(json.loads(second.stdout))
