"""Parser for nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf,
alltoall_perf, sendrecv_perf, broadcast_perf).

Formats handled (NVIDIA/nccl-tests src/util.cu and src/common.cu, v2.13 to v2.19, and older):

- the result table is found by its header line `#  size  count  type  redop  root  time  algbw
  busbw  #wrong  time  algbw  busbw  #wrong`; the columns are read from that line, so the
  pre-2.13 layout (no `root`, `error` instead of `#wrong`), tests without `redop`, `cputime`
  (-C) and a single (out-of-place only) half all parse; `#wrong`/`error` may be `N/A`;
- ranks and nodes come from the "Using devices" block (`#  Rank  0 Group  0 Pid ... on HOST
  device ...`, or the old `#   Rank  0 Pid ...`): one line per rank, nodes = distinct hosts;
  a log without that block (e.g. its head cut off) needs them given explicitly (explicit values
  only fill that gap: a block, written by nccl-tests itself, wins);
- lines may carry mpirun --tag-output prefixes (`[1,0]<stdout>:`) or srun --label prefixes
  (`0: `); NCCL INFO/WARN lines, SHARP/UCX logs, ssh and kubectl chatter and truncation markers
  (`...`, `--(snip)--`) between or inside the blocks are skipped;
- the collective comes from `# Collective test starting: all_reduce_perf` (nccl-tests 2025+),
  else from the file name (`..._all_reduce_...`), unless given explicitly;
- several tables in one file (concatenated runs) give several tables.

A row whose first field is an integer inside a table must be complete: a truncated row, a
non-numeric number or a table without rows is an InputError naming the file and line; so is a
row whose `#wrong` count is not 0 (the collective returned wrong data) and, once the cluster is
known (check_bus_bandwidth), a bus bandwidth no GPU of it can reach.
Units as printed: size in bytes, time in microseconds, algbw and busbw in GB/s (1e9 B/s).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from solver.errors import InputError
from solver.spec.calibration import Collective
from solver.spec.hardware import ClusterSpec
from solver.spec.strict import FLOAT_RANGE, MAX_MESSAGE_BYTES, read_input_file

# Test names as nccl-tests spells them (binaries, "Collective test starting" lines, file
# names), longest first so that "all_reduce" is not taken for "reduce".
TEST_NAMES: tuple[tuple[str, Collective], ...] = (
    ("reduce_scatter", "reduce_scatter"), ("reducescatter", "reduce_scatter"),
    ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"),
    ("all_gather", "all_gather"), ("allgather", "all_gather"),
    ("all_to_all", "all_to_all"), ("alltoall", "all_to_all"),
    ("send_recv", "send_recv"), ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"), ("bcast", "broadcast"),
)
UNSUPPORTED_TESTS = ("reduce_perf", "gather_perf", "scatter_perf", "hypercube_perf")

_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d+: )")
_DEVICE = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_TIME_NAMES = ("time", "cputime")
_WRONG_NAMES = ("#wrong", "wrong", "error", "#error")
# The columns that count wrong elements (nccl-tests 2.13+, common.cu: `wrongElts`, printed as
# an integer after each half's busbw when validation is on); the old format's `error` is the
# largest deviation from the expected values (5e-07 with SHARP's reduction order), not a count.
_WRONG_COUNT_NAMES = ("#wrong", "wrong")


@dataclass(frozen=True)
class NcclTiming:
    """One half of a row (out-of-place or in-place). `wrong` is the #wrong count (new format)
    or the max error (old format), None when printed N/A or absent."""

    time_us: float
    algbw_gb_per_s: float
    busbw_gb_per_s: float
    wrong: float | None


@dataclass(frozen=True)
class NcclRow:
    """One message size; `in_place` is None when the table has a single half."""

    line: int
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: NcclTiming
    in_place: NcclTiming | None

    @property
    def best(self) -> NcclTiming:
        """The faster half: both measure the same collective; the slower one saw noise."""
        if self.in_place is None or self.out_of_place.time_us <= self.in_place.time_us:
            return self.out_of_place
        return self.in_place


@dataclass(frozen=True)
class NcclTable:
    """One result table of a log, with what the log says about the run."""

    source: str
    header_line: int
    collective: Collective | None
    num_ranks: int | None
    num_nodes: int | None
    hosts: tuple[str, ...]
    old_format: bool
    rows: tuple[NcclRow, ...]
    avg_busbw_gb_per_s: float | None


@dataclass(frozen=True)
class _Columns:
    names: tuple[str, ...]
    size: int
    count: int
    dtype: int | None
    redop: int | None
    root: int | None
    halves: tuple[tuple[int, int, int, int | None], ...]  # time, algbw, busbw, wrong


def _strip(line: str) -> str:
    return _PREFIX.sub("", line.rstrip("\r\n"), count=1).strip()


def collective_from_name(name: str) -> Collective | None:
    """The collective a test or file name refers to ("all_reduce_perf", "p5_alltoall.txt")."""
    lowered = name.lower()
    for token, collective in TEST_NAMES:
        if token in lowered:
            return collective
    return None


def _parse_header(text: str, source: str, line: int) -> _Columns | None:
    names = tuple(text.lstrip("#").split())
    if "size" not in names or "busbw" not in names:
        return None

    def where(name: str) -> int | None:
        return names.index(name) if name in names else None

    halves = []
    for busbw, name in enumerate(names):
        if name != "busbw":
            continue
        before = names[:busbw]
        times = [i for i, n in enumerate(before) if n in _TIME_NAMES]
        algbws = [i for i, n in enumerate(before) if n == "algbw"]
        if not times or not algbws:
            raise InputError(f"{source}: line {line}: result header has 'busbw' without "
                             "'time' and 'algbw' before it")
        after = busbw + 1
        wrong = after if after < len(names) and names[after] in _WRONG_NAMES else None
        halves.append((times[-1], algbws[-1], busbw, wrong))
    if len(halves) > 2:
        raise InputError(f"{source}: line {line}: result header has {len(halves)} 'busbw' "
                         "columns; expected out-of-place and in-place")
    count = where("count")
    if count is None:
        raise InputError(f"{source}: line {line}: result header has no 'count' column")
    return _Columns(names=names, size=names.index("size"), count=count, dtype=where("type"),
                    redop=where("redop"), root=where("root"), halves=tuple(halves))


def _number(fields: list[str], index: int, columns: _Columns, source: str, line: int,
            half: str = "") -> float:
    text = fields[index].rstrip("*")  # rccl-tests marks out-of-threshold errors with '*'
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):  # float() reads nan, inf and 1e999 too
        where = f" ({half})" if half else ""
        what = "a number" if value is None else "a finite number"
        raise InputError(f"{source}: line {line}: field '{columns.names[index]}'{where} is "
                         f"{fields[index]!r}, not {what}")
    return value


def _integer(fields: list[str], index: int, columns: _Columns, source: str, line: int) -> int:
    try:
        return int(fields[index])
    except ValueError:
        raise InputError(f"{source}: line {line}: field '{columns.names[index]}' is "
                         f"{fields[index]!r}, not an integer") from None


def _parse_row(fields: list[str], columns: _Columns, source: str, line: int) -> NcclRow:
    if len(fields) != len(columns.names):
        raise InputError(f"{source}: line {line}: a result row needs {len(columns.names)} "
                         f"fields ({' '.join(columns.names)}), found {len(fields)} "
                         "(truncated or garbled row)")
    timings = []
    for half, (time, algbw, busbw, wrong) in zip(("out-of-place", "in-place"), columns.halves):
        wrong_value = None
        if wrong is not None and fields[wrong] != "N/A":
            wrong_value = _number(fields, wrong, columns, source, line, half)
        timing = NcclTiming(
            time_us=_number(fields, time, columns, source, line, half),
            algbw_gb_per_s=_number(fields, algbw, columns, source, line, half),
            busbw_gb_per_s=_number(fields, busbw, columns, source, line, half),
            wrong=wrong_value,
        )
        if wrong_value and columns.names[wrong] in _WRONG_COUNT_NAMES:
            raise InputError(f"{source}: line {line}: field '{columns.names[wrong]}' ({half}) "
                             f"is {fields[wrong]}: nccl-tests found that many wrong elements "
                             "in the result, so the collective's time is not one to fit")
        if timing.time_us <= 0 or timing.busbw_gb_per_s < 0 or timing.algbw_gb_per_s < 0:
            raise InputError(f"{source}: line {line}: {half} time must be positive and "
                             "bandwidths non-negative")
        low, high = FLOAT_RANGE
        if any(value and not low <= value <= high for value in (
                timing.time_us, timing.busbw_gb_per_s, timing.algbw_gb_per_s)):
            raise InputError(f"{source}: line {line}: {half} time and bandwidths must lie "
                             f"between {low:g} and {high:g} (us, GB/s)")
        timings.append(timing)
    size = _integer(fields, columns.size, columns, source, line)
    if size < 0:
        raise InputError(f"{source}: line {line}: field 'size' is {size}, must not be negative")
    if MAX_MESSAGE_BYTES.check(size) is not None:
        raise InputError(f"{source}: line {line}: field 'size': {MAX_MESSAGE_BYTES.check(size)}")
    root = None if columns.root is None else _integer(fields, columns.root, columns, source, line)
    return NcclRow(
        line=line, size_bytes=size,
        count=_integer(fields, columns.count, columns, source, line),
        dtype="" if columns.dtype is None else fields[columns.dtype],
        redop=None if columns.redop is None else fields[columns.redop],
        root=root, out_of_place=timings[0],
        in_place=timings[1] if len(timings) > 1 else None,
    )


def _is_row(text: str) -> bool:
    first = text.split(maxsplit=1)[0] if text else ""
    return first.isdigit()


def parse_nccl_tests(text: str, source: str, *, collective: Collective | None = None,
                     num_ranks: int | None = None, num_nodes: int | None = None
                     ) -> list[NcclTable]:
    """Every result table of one nccl-tests log. `collective`, when given, overrides what the
    log says; `num_ranks` and `num_nodes` are used for tables without a "Using devices" block
    (the block, written by nccl-tests itself, wins)."""
    tables: list[NcclTable] = []
    devices: dict[int, str] = {}
    named: Collective | None = None
    columns: _Columns | None = None
    header_line = 0
    rows: list[NcclRow] = []
    average: float | None = None
    old_format = False

    def close() -> None:
        nonlocal columns, rows, average
        if columns is None:
            return
        if not rows:
            raise InputError(f"{source}: line {header_line}: the result table has no rows")
        hosts = tuple(dict.fromkeys(devices[r] for r in sorted(devices)))
        tables.append(NcclTable(
            source=source, header_line=header_line,
            collective=collective or named or collective_from_name(Path(source).name),
            num_ranks=len(devices) or num_ranks,
            num_nodes=len(hosts) or num_nodes,
            hosts=hosts, old_format=old_format, rows=tuple(rows), avg_busbw_gb_per_s=average,
        ))
        columns, rows, average = None, [], None

    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip(raw)
        if not line:
            continue
        if line.startswith("#"):
            if line.lstrip("#").strip() == "Using devices":
                close()
                devices = {}
            elif match := _DEVICE.match(line):
                devices[int(match.group(1))] = match.group(2)
            elif match := _STARTING.match(line):
                close()
                test = match.group(1)
                if any(test.startswith(name) for name in UNSUPPORTED_TESTS):
                    raise InputError(f"{source}: line {number}: {test} is not supported "
                                     "(all_reduce, all_gather, reduce_scatter, alltoall, "
                                     "sendrecv, broadcast are)")
                named = collective_from_name(test)
            elif match := _AVERAGE.match(line):
                if columns is not None:
                    try:
                        average = float(match.group(1))
                    except ValueError:
                        average = None
                    if average is not None and not math.isfinite(average):
                        average = None
                    close()
            elif (found := _parse_header(line, source, number)) is not None:
                close()
                columns, header_line = found, number
                old_format = "root" not in found.names
            continue
        if columns is not None and _is_row(line):
            rows.append(_parse_row(line.split(), columns, source, number))
    close()
    if not tables:
        raise InputError(f"{source}: no nccl-tests result table found (a '#  size  count  "
                         "type ... time  algbw  busbw' header line followed by rows)")
    return tables


def load_nccl_tests(path: str | Path, *, collective: Collective | None = None,
                    num_ranks: int | None = None, num_nodes: int | None = None
                    ) -> list[NcclTable]:
    """Read and parse one log file (see parse_nccl_tests)."""
    path = Path(path)
    try:
        text = read_input_file(path).decode("utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{path}: cannot read file ({exc.__class__.__name__}: {exc})") from None
    return parse_nccl_tests(text, str(path), collective=collective, num_ranks=num_ranks,
                            num_nodes=num_nodes)


def find_bus_bandwidth_bound(cluster: ClusterSpec) -> float:
    """The largest nccl-tests busbw (GB/s) a GPU of `cluster` can show: twice its fastest link
    per direction (NVLink or xGMI `nvlink_gb_per_s`, the host link, or a tier's rate, if that
    is higher). Why twice: busbw counts the bytes a ring moves per GPU and direction
    (nccl-tests doc/PERFORMANCE.md: all-reduce algbw x 2(n-1)/n), and an in-network reduction
    (NVLS, SHARP) moves each GPU's S bytes once out and once in, so its busbw 2(n-1)/n x S/t
    stays below 2 x the per-direction line rate; the other collectives stay below 1 x. DGX H100
    (NVLink 450 GB/s per direction): at most 900 GB/s, where its NVLS all-reduce peaks at
    479.9 GB/s and its ring at about 370 (tests/data/nccl). With no link given, the GPU's
    memory bandwidth bounds it: every byte sent is read from, and every byte received written
    to, its memory."""
    gpu = cluster.gpu
    links = [gpu.nvlink_gb_per_s, gpu.host_link_gb_per_s or 0.0,
             *(tier.bandwidth_gb_per_s for tier in cluster.tiers)]
    fastest = max(links)
    return 2.0 * fastest if fastest > 0 else gpu.hbm_gb_per_s


def check_bus_bandwidth(table: NcclTable, cluster: ClusterSpec) -> None:
    """Refuse a row whose busbw (either half) exceeds find_bus_bandwidth_bound: a typo, a
    wrong unit or a made-up row, which the fit would take as a measurement."""
    bound = find_bus_bandwidth_bound(cluster)
    for row in table.rows:
        for half, timing in (("out-of-place", row.out_of_place), ("in-place", row.in_place)):
            if timing is not None and timing.busbw_gb_per_s > bound:
                raise InputError(
                    f"{table.source}: line {row.line}: field 'busbw' ({half}) is "
                    f"{timing.busbw_gb_per_s:g} GB/s, above what a {cluster.gpu.name} of "
                    f"cluster '{cluster.name}' can reach ({bound:g} GB/s: twice its fastest "
                    "link per direction)")
