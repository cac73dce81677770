"""Summarize ncu's per-instruction stall sampling of one kernel (the source page of a `--set full` report).

  python dev/ncu_source.py OURS_source.csv [PEER_source.csv ...] [--top 20]

Each CSV is `ncu -i REPORT --page source --csv --print-source sass` (gpu_check `ncusource` writes them). Prints per
kernel: the warp-stall samples by reason and by opcode, the instructions with the most samples (with the reasons that
hold more than 15% of their samples), every mbarrier try-wait with the samples on it and on the branch that spins
on it (where the math warps wait for TMA data or tile slots, and where the producer waits for free stages), and the
samples in the loops (instructions executed more often than the kernel's first instruction, which every warp runs
once) against those outside them (prologue, tile setup, epilogue, exit): two kernels with the same loop samples
differ outside them. (A threshold relative to the hottest instruction misfiled DeepGEMM's prologue as loop code: its
K loop is unrolled by 8, so its hottest instruction runs only ~3.5x as often as its prologue.)
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass(frozen=True)
class Instruction:
    index: int
    source: str
    samples: int
    executed: int
    stalls: dict[str, int]  # reason (without the "stall_" prefix) -> samples

    @property
    def opcode(self) -> str:
        words = self.source.split()
        word = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")
        return word.split(".")[0]


def load(path: Path) -> list[Instruction]:
    """The instructions of the first kernel in `path` (the row after the kernel-name line is the header)."""
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    header_at = next((i for i, row in enumerate(rows) if SAMPLES in row), None)
    if header_at is None:
        raise SystemExit(f"{path}: no source page with '{SAMPLES}' (did ncu fail? the file starts: {rows[:2]})")
    header = rows[header_at]
    column = {name: i for i, name in enumerate(header)}
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    out: list[Instruction] = []
    for row in rows[header_at + 1:]:
        if len(row) < len(header):
            break  # the next kernel's name line
        stalls = {name[len("stall_"):]: int(row[column[name]] or 0) for name in reasons}
        out.append(Instruction(len(out), row[column["Source"]].strip(), int(row[column[SAMPLES]] or 0),
                               int(row[column[EXECUTED]] or 0), stalls))
    return out


def barrier_waits(instructions: list[Instruction]) -> list[tuple[int, Instruction]]:
    """(samples on the try-wait and on the branch that retries it, the try-wait), most samples first."""
    waits = []
    for i, inst in enumerate(instructions):
        if "TRYWAIT" not in inst.source:
            continue
        spin = next((nxt.samples for nxt in instructions[i + 1:i + 6] if "BRA" in nxt.source), 0)
        waits.append((inst.samples + spin, inst))
    return sorted(waits, key=lambda item: -item[0])


def summarize(path: Path, top: int) -> None:
    instructions = load(path)
    total = sum(inst.samples for inst in instructions) or 1
    reasons: Counter[str] = Counter()
    opcodes: Counter[str] = Counter()
    for inst in instructions:
        reasons.update(inst.stalls)
        opcodes[inst.opcode] += inst.samples
    executed = sum(inst.executed for inst in instructions)

    def share(count: int) -> str:
        return f"{100 * count / total:.1f}%"

    print(f"## {path.name}: {total} samples, {executed} warp instructions")
    print("by reason: " + ", ".join(f"{name} {share(count)}" for name, count in reasons.most_common(10)))
    print("by opcode: " + ", ".join(f"{name} {share(count)}" for name, count in opcodes.most_common(12)))
    print("| share | # | executed | instruction | main reasons |")
    print("|---|---|---|---|---|")
    for inst in sorted(instructions, key=lambda inst: -inst.samples)[:top]:
        main = ", ".join(f"{name} {count}" for name, count in inst.stalls.items() if count > 0.15 * inst.samples)
        print(f"| {share(inst.samples)} | {inst.index} | {inst.executed} | `{inst.source[:70]}` | {main} |")
    warps = instructions[0].executed if instructions else 0  # the entry instruction: once per launched warp
    for name, region in (("in loops", [i for i in instructions if i.executed > warps]),
                         ("outside loops", [i for i in instructions if i.executed <= warps])):
        held: Counter[str] = Counter()
        for inst in region:
            held.update(inst.stalls)
        count = sum(inst.samples for inst in region)
        print(f"{name}: {count} samples ({share(count)}), " + ", ".join(f"{reason} {n}" for reason, n in held.most_common(6)))
    print("barrier waits (try-wait + its retry branch):")
    for samples, inst in barrier_waits(instructions):
        if samples:
            print(f"  {share(samples):>6} #{inst.index} executed {inst.executed}: {inst.source[:70]}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    for path in args.csv:
        summarize(path, args.top)


if __name__ == "__main__":
    main()
