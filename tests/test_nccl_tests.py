"""The nccl-tests parser against four real logs (tests/data/nccl/README.md gives their sources)
and against synthetic logs in the other layouts nccl-tests prints (src/util.cu formats)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.calibrate.fit import build_measurement
from solver.calibrate.nccl_tests import collective_from_name, load_nccl_tests, parse_nccl_tests
from solver.errors import InputError

DATA = Path(__file__).resolve().parent / "data" / "nccl"
DGX = DATA / "nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt"
GCP = DATA / "gcp_a3mega_h100_2node_tcpxo_all_reduce.txt"
AWS = DATA / "aws_p5_h100_2node_efa_all_reduce_tagged.txt"
ABCI = DATA / "abci_a100_2node_ib_hdr_sharp_all_reduce_oldformat.txt"


def only_table(path: Path, **given: object):
    tables = load_nccl_tests(path, **given)  # type: ignore[arg-type]
    assert len(tables) == 1
    return tables[0]


def all_busbw(table) -> list[float]:
    return [t.busbw_gb_per_s for r in table.rows for t in (r.out_of_place, r.in_place)]


@pytest.mark.parametrize(("path", "num_rows", "average"), [
    (DGX, 32, 159.151), (GCP, 31, 70.742), (AWS, 32, 123.343), (ABCI, 29, 29.0317),
])
def test_every_row_is_read(path: Path, num_rows: int, average: float) -> None:
    """nccl-tests prints the mean of every busbw value (both halves) as 'Avg bus bandwidth';
    the parsed rows give the same mean, so none was dropped or misread (README check)."""
    table = only_table(path)
    assert len(table.rows) == num_rows
    assert table.avg_busbw_gb_per_s == average
    busbw = all_busbw(table)
    assert sum(busbw) / len(busbw) == pytest.approx(average, abs=2e-3)
    assert table.collective == "all_reduce"
    assert [r.size_bytes for r in table.rows] == [8 * 2**i for i in range(num_rows)]


def test_dgx_h100_rows_and_devices() -> None:
    table = only_table(DGX)
    assert (table.num_ranks, table.num_nodes, table.hosts) == (8, 1, ("pool0-01806",))
    assert not table.old_format
    first, last = table.rows[0], table.rows[-1]
    assert (first.size_bytes, first.count, first.dtype, first.redop, first.root) == (
        8, 2, "float", "sum", -1)
    assert first.out_of_place.time_us == 13.67 and first.in_place.time_us == 13.03
    assert first.out_of_place.wrong == 0
    # The 32 B out-of-place outlier (68.14 us): the faster half is the in-place one.
    outlier = table.rows[2]
    assert outlier.out_of_place.time_us == 68.14 and outlier.best.time_us == 13.52
    assert (last.size_bytes, last.out_of_place.time_us, last.out_of_place.algbw_gb_per_s,
            last.out_of_place.busbw_gb_per_s) == (17179869184, 62648, 274.23, 479.90)
    assert last.in_place.busbw_gb_per_s == 479.99
    mid = table.rows[20]  # 8 MiB
    assert (mid.size_bytes, mid.out_of_place.busbw_gb_per_s, mid.in_place.time_us) == (
        8388608, 176.77, 82.03)


def test_gcp_two_nodes_from_host_names() -> None:
    table = only_table(GCP)
    assert (table.num_ranks, table.num_nodes) == (16, 2)
    assert table.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    peak = max(table.rows, key=lambda r: r.out_of_place.busbw_gb_per_s)
    assert (peak.size_bytes, peak.out_of_place.busbw_gb_per_s) == (8589934592, 338.82)
    assert table.rows[7].out_of_place.time_us == 147.1  # 1 KiB, an out-of-place hiccup
    assert table.rows[7].best.time_us == 123.1


def test_aws_tagged_lines_without_device_block() -> None:
    """mpirun --tag-output prefixes are stripped; the head (devices) was cut off in the
    source, so ranks and nodes must be given; a 17-digit size overflows its column."""
    table = only_table(AWS)
    assert table.num_ranks is None and table.num_nodes is None
    with pytest.raises(InputError, match="pass --ranks and --nodes"):
        build_measurement(table)
    given = only_table(AWS, num_ranks=16, num_nodes=2)
    assert (given.num_ranks, given.num_nodes) == (16, 2)
    last = given.rows[-1]
    assert (last.size_bytes, last.count, last.out_of_place.busbw_gb_per_s,
            last.in_place.busbw_gb_per_s) == (17179869184, 4294967296, 480.87, 482.82)
    one_gib = given.rows[27]
    assert (one_gib.out_of_place.time_us, one_gib.in_place.time_us) == (4556.5, 5274.0)


def test_explicit_ranks_do_not_override_the_device_block() -> None:
    assert only_table(DGX, num_ranks=16, num_nodes=2).num_ranks == 8


def test_abci_old_format_with_log_noise() -> None:
    """Pre-2.13: no root column, an 'error' max deviation instead of #wrong, '#   Rank  0 Pid'
    device lines; SHARP log lines and a --(snip)-- marker before the table."""
    table = only_table(ABCI)
    assert table.old_format
    assert (table.num_ranks, table.num_nodes, table.hosts) == (16, 2, ("a0000", "a0001"))
    first, last = table.rows[0], table.rows[-1]
    assert first.root is None and first.redop == "sum"
    assert first.out_of_place.wrong == 4e-7 and first.in_place.wrong == 4e-7
    assert (last.size_bytes, last.out_of_place.time_us, last.out_of_place.busbw_gb_per_s,
            last.in_place.busbw_gb_per_s) == (2147483648, 38180, 105.46, 105.51)
    assert table.rows[18].out_of_place.busbw_gb_per_s == 18.28  # 2 MiB


# ---- synthetic logs in the layouts of src/util.cu ------------------------------------------

DEVICES_2x2 = """# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1001 on     node-a device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   1002 on     node-a device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid   2001 on     node-b device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   2002 on     node-b device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#
"""
NEW_HEADER = """#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def new_row(size: int, count: int, redop: str, root: int, halves: list[tuple]) -> str:
    text = f"{size:12d}  {count:12d}  {'float':>8s}  {redop:>6s}  {root:6d}"
    for time, algbw, busbw, wrong in halves:
        text += f"  {time:7.2f}  {algbw:6.2f}  {busbw:6.2f}  {wrong:>6s}"
    return text + "\n"


def alltoall_log() -> str:
    """alltoall_perf, 4 ranks on 2 nodes, factor 3/4, with NCCL INFO lines inside the table."""
    rows = ""
    for size, time in ((1024, 20.0), (2048, 21.0), (4096, 22.0)):
        algbw = size / time / 1e3
        rows += new_row(size, size // 16, "none", -1,
                        [(time, algbw, algbw * 0.75, "0"), (time + 1, algbw, algbw * 0.75, "N/A")])
        rows += "node-a:1001:1010 [0] NCCL INFO comm 0x5555 rank 0 nranks 4 - Init COMPLETE\n"
    return ("# Collective test starting: alltoall_perf\n" + DEVICES_2x2 + NEW_HEADER + rows
            + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.15 \n#\n"
            "# Collective test concluded: alltoall_perf\n")


def test_collective_line_na_wrong_and_info_lines_inside_the_table() -> None:
    (table,) = parse_nccl_tests(alltoall_log(), "run.log")
    assert table.collective == "all_to_all"
    assert (table.num_ranks, table.num_nodes) == (4, 2)
    assert [r.size_bytes for r in table.rows] == [1024, 2048, 4096]
    assert table.rows[0].in_place.wrong is None and table.rows[0].out_of_place.wrong == 0
    assert table.rows[0].redop == "none"
    measurement = build_measurement(table)
    assert measurement.time_s[0] == pytest.approx(20e-6)


def test_old_all_gather_has_neither_redop_nor_root() -> None:
    header = ("#                                              out-of-place                    "
              "   in-place\n"
              "#       size         count      type     time   algbw   busbw  error     time   "
              "algbw   busbw  error\n"
              "#        (B)    (elements)               (us)  (GB/s)  (GB/s)            (us)  "
              "(GB/s)  (GB/s)\n")
    rows = ("        4096           256     float    30.11    0.14    0.10  0e+00    29.80    "
            "0.14    0.10    N/A\n"
            "        8192           512     float    31.50    0.26    0.20  0e+00    31.02    "
            "0.26    0.20    N/A\n")
    (table,) = parse_nccl_tests(DEVICES_2x2 + header + rows, "cluster_allgather_perf.txt")
    assert table.collective == "all_gather" and table.old_format
    assert table.rows[1].redop is None and table.rows[1].root is None
    assert table.rows[1].in_place.wrong is None and table.rows[1].best.time_us == 31.02


def test_broadcast_and_sendrecv_and_two_tables_in_one_file() -> None:
    broadcast = "".join(new_row(s, s // 4, "none", 0, [(10.0 + s / 1e3, 1.0, 1.0, "0")] * 2)
                        for s in (1024, 2048))
    sendrecv = "".join(new_row(s, s // 4, "none", -1, [(5.0 + s / 1e3, 1.0, 1.0, "0")] * 2)
                       for s in (1024, 2048, 4096))
    text = ("# Collective test starting: broadcast_perf\n" + DEVICES_2x2 + NEW_HEADER + broadcast
            + "# Avg bus bandwidth    : 1 \n"
            + "# Collective test starting: sendrecv_perf\n" + DEVICES_2x2 + NEW_HEADER + sendrecv
            + "# Avg bus bandwidth    : 1 \n")
    first, second = parse_nccl_tests(text, "mixed.log")
    assert (first.collective, len(first.rows), first.rows[0].root) == ("broadcast", 2, 0)
    assert (second.collective, len(second.rows)) == ("send_recv", 3)


def test_srun_label_prefix() -> None:
    text = "".join(f"0: {line}\n" for line in alltoall_log().splitlines())
    (table,) = parse_nccl_tests(text, "run.log")
    assert len(table.rows) == 3 and table.num_ranks == 4


@pytest.mark.parametrize(("name", "collective"), [
    ("all_reduce_perf", "all_reduce"), ("reduce_scatter_perf", "reduce_scatter"),
    ("p5_allgather.txt", "all_gather"), ("alltoall_perf", "all_to_all"),
    ("sendrecv_perf", "send_recv"), ("broadcast_perf", "broadcast"), ("notes.txt", None),
])
def test_collective_from_name(name: str, collective: str | None) -> None:
    assert collective_from_name(name) == collective


NOISE = [
    "NCCL version 2.18.1+cuda12.1",
    "node-a:1001:1010 [0] NCCL INFO Channel 00/32 :    0   1   2   3",
    "node-a:1001:1010 [0] NCCL WARN NET/OFI Only EFA provider is supported",
    "Warning: Permanently added '10.0.0.2' (ECDSA) to the list of known hosts.",
    "Defaulted container \"nccl-test\" out of: nccl-test, init (init)",
    "[a0000:0:2916721 - context.c:589] INFO job (ID: 2838387367436317) resource request",
    "...",
    "--(snip)--",
    "# <smaller message sizes truncated>",
]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 80), st.sampled_from(NOISE)), max_size=12))
def test_noise_lines_anywhere_change_nothing(inserts: list[tuple[int, str]]) -> None:
    lines = DGX.read_text(encoding="utf-8").splitlines()
    for position, noise in sorted(inserts, reverse=True):
        lines.insert(min(position, len(lines)), noise)
    (table,) = parse_nccl_tests("\n".join(lines), DGX.name)
    (clean,) = parse_nccl_tests(DGX.read_text(encoding="utf-8"), DGX.name)
    assert table.rows == tuple(r.__class__(**{**r.__dict__, "line": t.line})
                               for r, t in zip(clean.rows, table.rows))
    assert table.num_ranks == 8


# ---- malformed logs ----------------------------------------------------------------------


def broken(tmp_path: Path, edit) -> Path:
    lines = DGX.read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path / "dgx_all_reduce.txt"
    path.write_text("".join(edit(lines)), encoding="utf-8")
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda lines: lines[:30] + [lines[30][:60] + "\n"],
     r"line 31: a result row needs 13 fields"),
    (lambda lines: lines[:40] + ["   " + lines[40][:-1].strip()[:-40] + "\n"] + lines[41:],
     r"line 41: a result row needs 13 fields"),
    (lambda lines: lines[:26] + [lines[26].replace("0.91", "abc", 1)] + lines[27:],
     r"line 27: field 'algbw' \(out-of-place\) is 'abc', not a number"),
    (lambda lines: lines[:26] + [lines[26].replace("17.24", "17,24", 1)] + lines[27:],
     r"line 27: field 'time' \(in-place\) is '17,24', not a number"),
    (lambda lines: lines[:20] + [lines[20].replace("float", "float 7", 1)] + lines[21:],
     r"line 21: a result row needs 13 fields"),
    (lambda lines: lines[:13] + lines[15:], r"no nccl-tests result table found"),
    (lambda lines: lines[:15], r"line 14: the result table has no rows"),
])
def test_malformed_logs_name_file_and_line(tmp_path: Path, edit, message: str) -> None:
    path = broken(tmp_path, edit)
    with pytest.raises(InputError, match=message) as info:
        load_nccl_tests(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_unsupported_test_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="line 1: reduce_perf is not supported"):
        parse_nccl_tests("# Collective test starting: reduce_perf\n" + DEVICES_2x2, "x.log")


def test_wrong_rank_count_shows_in_the_bus_factor() -> None:
    """busbw / algbw of the AWS log is 480.87 / 256.46 = 1.875 = 2 x 15/16: 16 ranks."""
    table = only_table(AWS, num_ranks=8, num_nodes=1)
    with pytest.raises(InputError, match=r"busbw / algbw is 1.875 .* factor 1.750"):
        build_measurement(table)
