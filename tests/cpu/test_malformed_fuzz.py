"""Seeded fuzz of the public API: ~250 malformed calls and ~100 random valid ones (issue 25).

Every malformed call must raise TypeError / ValueError / a deepgemm error whose message quotes the argument at fault
('a[0]', 'out', ...); every valid call must match a float64 reference. The outcome counts are printed (run with -s):
typed errors naming the argument, typed errors that do not name it, silent successes, other exceptions. The seed is
printed too; DEEPGEMM_FUZZ_SEED replays another one.

Content of the grouping tensors (m_indices / psum / masked_m values) is not fuzzed: what the kernels do with odd
values is documented behaviour (and another point of the issue).
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import deepgemm
from deepgemm.api import gemm as gemm_api
from tests.helpers import assert_close_to_reference, reference_abs_fp64, reference_fp64

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
F32 = torch.float32
META = torch.device("meta")
SEED = int(os.environ.get("DEEPGEMM_FUZZ_SEED", "25"))
MALFORMED_CALLS = 250
VALID_CALLS = 100
TYPED = (TypeError, ValueError, deepgemm.DeepGemmError)
# Other spellings the messages use for an argument: the operand pairs' scales are also called sfa / sfb, their
# tensors a / b (device messages), and a K mismatch quotes both operands.
ALIASES = {"a[1]": ("sfa",), "b[1]": ("sfb",), "a[0]": ("a",), "b[0]": ("b",)}


@dataclass
class Call:
    label: str
    run: Callable[[], object]
    names: tuple[str, ...]  # the argument(s) the error must name (any one of them, or an alias)


class Maker:
    """Random operands from one seeded generator (Python's for choices and sizes, torch's for values)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def choice(self, options):  # type: ignore[no-untyped-def]
        return options[self.rng.randrange(len(options))]

    def k16(self, low: int = 1, high: int = 24) -> int:
        return 16 * self.rng.randint(low, high)

    def bad_k(self) -> int:
        k = self.rng.randint(17, 400)
        return k if k % 16 else k + self.rng.randint(1, 15)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def fp8(self, *shape: int) -> torch.Tensor:
        return (self.randn(*shape) * 8).to(FP8)

    def scales(self, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=self.gen) + 0.25

    # ---- operand sets
    def dense(self, m: int | None = None, n: int | None = None, k: int | None = None):
        m = self.rng.randint(1, 96) if m is None else m
        n = 8 * self.rng.randint(1, 24) if n is None else n
        k = self.k16() if k is None else k
        a = (self.fp8(m, k), self.scales(m, -(-k // 128)))
        b = (self.fp8(n, k), self.scales(-(-n // 128), -(-k // 128)))
        return a, b

    def grouped_b(self, groups: int, n: int, k: int):
        return self.fp8(groups, n, k), self.scales(groups, -(-n // 128), -(-k // 128))

    def contiguous(self, k: int | None = None):
        groups = self.rng.randint(1, 3)
        n, k = 8 * self.rng.randint(1, 12), self.k16(1, 16) if k is None else k
        segments = [self.rng.randint(0, 200) for _ in range(groups)]
        indices: list[int] = []
        for g, count in enumerate(segments):
            indices += [g] * count + [-1] * (-(-count // 128) * 128 - count)
        if not indices:
            indices = [-1] * 128
        m_total = len(indices)
        a = (self.fp8(m_total, k), self.scales(m_total, -(-k // 128)))
        out = torch.empty(m_total, n, dtype=self.choice([BF16, F32]))
        return a, self.grouped_b(groups, n, k), out, torch.tensor(indices, dtype=torch.int32), segments

    def masked(self, k: int | None = None):
        groups, max_m = self.rng.randint(1, 3), 64 * self.rng.randint(1, 2)
        n, k = 8 * self.rng.randint(1, 12), self.k16(1, 16) if k is None else k
        a = (self.fp8(groups, max_m, k), self.scales(groups, max_m, -(-k // 128)))
        masked_m = torch.tensor([self.rng.randint(0, max_m) for _ in range(groups)], dtype=torch.int32)
        out = torch.zeros(groups, max_m, n, dtype=self.choice([BF16, F32]))
        return a, self.grouped_b(groups, n, k), out, masked_m, self.rng.randint(1, max_m)

    def kgrouped(self):
        groups = self.rng.randint(1, 3)
        ks = [128 * self.rng.randint(0, 3) for _ in range(groups)]
        if sum(ks) == 0:
            ks[0] = 128
        m, n, k_total = 8 * self.rng.randint(1, 6), 8 * self.rng.randint(1, 6), sum(ks)
        a = (self.fp8(m, k_total), self.scales(m, k_total // 128))
        b = (self.fp8(n, k_total), self.scales(n, k_total // 128))
        return a, b, torch.empty(groups, m, n), ks

    def offset(self, t: torch.Tensor, elements: int | None = None) -> torch.Tensor:
        """A copy of `t` whose data pointer is 1..15 bytes (a whole number of elements) past a 16-byte boundary."""
        per_16 = 16 // t.element_size()
        elements = self.rng.randint(1, per_16 - 1) if elements is None else elements
        flat = torch.empty(t.numel() + per_16, dtype=t.dtype)[elements:elements + t.numel()]
        view = flat.view(t.shape)
        view.copy_(t)
        return view


# ---------------------------------------------------------------- malformed calls, one family per rule


def _dense_families(mk: Maker) -> list[Callable[[], Call]]:
    gemm = deepgemm.fp8_gemm_nt

    def not_a_pair() -> Call:
        a, b = mk.dense()
        bad = mk.choice([None, 3, "a", (a[0],), (a[0], a[1], a[1]), {"q": a[0], "sf": a[1]}, a[0]])
        if mk.rng.random() < 0.5:
            return Call("dense a not a pair", lambda: gemm(bad, b), ("a",))
        return Call("dense b not a pair", lambda: gemm(a, bad), ("b",))

    def member_not_tensor() -> Call:
        a, b = mk.dense()
        which = mk.choice(["a[0]", "a[1]", "b[0]", "b[1]"])
        value = mk.choice([1.0, None, np.zeros((2, 2)), [[0.0]]])
        a2 = (value, a[1]) if which == "a[0]" else (a[0], value) if which == "a[1]" else a
        b2 = (value, b[1]) if which == "b[0]" else (b[0], value) if which == "b[1]" else b
        return Call(f"dense {which} not a tensor", lambda: gemm(a2, b2), (which,))

    def operand_dtype() -> Call:
        a, b = mk.dense()
        dtype = mk.choice([BF16, F32, torch.int8, torch.uint8, torch.float8_e5m2, torch.float16])
        if mk.rng.random() < 0.5:
            return Call("dense a[0] dtype", lambda: gemm((a[0].float().to(dtype), a[1]), b), ("a[0]",))
        return Call("dense b[0] dtype", lambda: gemm(a, (b[0].float().to(dtype), b[1])), ("b[0]",))

    def scale_dtype() -> Call:
        a, b = mk.dense()
        dtype = mk.choice([torch.float64, BF16, torch.float16, torch.int32])
        if mk.rng.random() < 0.5:
            return Call("dense a[1] dtype", lambda: gemm((a[0], a[1].to(dtype)), b), ("a[1]",))
        return Call("dense b[1] dtype", lambda: gemm(a, (b[0], b[1].to(dtype))), ("b[1]",))

    def operand_rank() -> Call:
        a, b = mk.dense()
        reshape = mk.choice([lambda t: t[0], lambda t: t.unsqueeze(0), lambda t: t.reshape(-1)])
        if mk.rng.random() < 0.5:
            return Call("dense a[0] rank", lambda: gemm((reshape(a[0]), a[1]), b), ("a[0]",))
        return Call("dense b[0] rank", lambda: gemm(a, (reshape(b[0]), b[1])), ("b[0]",))

    def k_mismatch() -> Call:
        m, n, k = mk.rng.randint(1, 64), 8 * mk.rng.randint(1, 16), mk.k16()
        a, _ = mk.dense(m, n, k)
        _, b = mk.dense(m, n, k + 16 * mk.rng.randint(1, 4))
        return Call("dense K mismatch", lambda: gemm(a, b), ("a[0]", "b[0]"))

    def scale_shape() -> Call:
        a, b = mk.dense()
        rows, cols = a[1].shape
        if mk.rng.random() < 0.5:
            bad = mk.choice([(rows + 1, cols), (rows, cols + 1), (cols, rows + 1), (rows * cols + 1,)])
            return Call("dense a[1] shape", lambda: gemm((a[0], torch.ones(bad)), b), ("a[1]",))
        rows, cols = b[1].shape
        bad = mk.choice([(rows + 1, cols), (rows, cols + 1), (b[0].shape[0], cols), (rows * cols + 1,)])
        return Call("dense b[1] shape", lambda: gemm(a, (b[0], torch.ones(bad))), ("b[1]",))

    def k_not_16() -> Call:
        a, b = mk.dense(k=mk.bad_k())
        return Call(f"dense K={a[0].shape[1]}", lambda: gemm(a, b), ("a[0]",))

    def operand_misaligned() -> Call:
        a, b = mk.dense()
        if mk.rng.random() < 0.5:
            return Call("dense a[0] misaligned", lambda: gemm((mk.offset(a[0]), a[1]), b), ("a[0]",))
        return Call("dense b[0] misaligned", lambda: gemm(a, (mk.offset(b[0]), b[1])), ("b[0]",))

    def operand_strides() -> Call:
        m, n, k = mk.rng.randint(2, 64), 8 * mk.rng.randint(1, 16), mk.k16()
        a, b = mk.dense(m, n, k)
        if mk.rng.random() < 0.5:
            padded = mk.fp8(m, k + mk.rng.randint(1, 15))[:, :k]  # rows not 16 bytes apart
            return Call("dense a[0] row stride", lambda: gemm((padded, a[1]), b), ("a[0]",))
        strided = mk.fp8(n, 2 * k)[:, ::2]  # non-unit column stride
        return Call("dense b[0] column stride", lambda: gemm(a, (strided, b[1])), ("b[0]",))

    def out_layout() -> Call:
        m, n = mk.rng.randint(2, 64), 8 * mk.rng.randint(1, 16)
        a, b = mk.dense(m, n)
        dtype = mk.choice([BF16, F32])
        kind = mk.choice(["transposed", "row stride", "misaligned", "shape", "dtype", "not a tensor"])
        if kind == "transposed":
            out = torch.empty(n, m, dtype=dtype).t()
        elif kind == "row stride":
            out = torch.empty(m, n + (1 if dtype == F32 else mk.choice([1, 2, 3, 5])), dtype=dtype)[:, :n]
        elif kind == "misaligned":
            out = mk.offset(torch.empty(m, n, dtype=dtype))
        elif kind == "shape":
            out = torch.empty(mk.choice([s for s in [(m + 1, n), (m, n + 8), (n, m), (m * n,)] if s != (m, n)]), dtype=dtype)
        elif kind == "dtype":
            out = torch.empty(m, n, dtype=mk.choice([torch.float16, torch.float64, torch.int32]))
        else:
            out = mk.choice([[[0.0] * n] * m, np.zeros((m, n)), 0.0])  # type: ignore[assignment]
        return Call(f"dense out {kind}", lambda: gemm(a, b, out), ("out",))

    def out_overlap() -> Call:
        m, n = mk.rng.randint(2, 64), 8 * mk.rng.randint(1, 16)
        (a0, sfa), b = mk.dense(m, n)
        kind = mk.choice(["a[1]", "b[1]", "broadcast", "rows"])
        if kind in ("a[1]", "b[1]"):
            scale = sfa if kind == "a[1]" else b[1]
            buffer = torch.zeros(scale.numel() + m * n)
            shared = buffer[:scale.numel()].view(scale.shape)
            shared.copy_(scale)
            start = 4 * mk.rng.randint(0, (scale.numel() - 1) // 4)
            out = buffer[start:start + m * n].view(m, n)
            a, bb = ((a0, shared), b) if kind == "a[1]" else ((a0, sfa), (b[0], shared))
            return Call(f"dense out overlaps {kind}", lambda: gemm(a, bb, out), ("out",))
        if kind == "broadcast":
            out = torch.zeros(1, n).expand(m, n)
        else:
            out = torch.zeros(m * 4 + n).as_strided((m, n), (4, 1))  # rows 16 bytes apart, n >= 8 wide
        return Call(f"dense out overlaps itself ({kind})", lambda: gemm((a0, sfa), b, out), ("out",))

    def out_dtype() -> Call:
        a, b = mk.dense()
        if mk.rng.random() < 0.5:
            bad = mk.choice([torch.float16, torch.float64, FP8, "bf16", 1])
            return Call("dense out_dtype", lambda: gemm(a, b, out_dtype=bad), ("out_dtype",))
        m, n = a[0].shape[0], b[0].shape[0]
        out = torch.empty(m, n, dtype=BF16)
        return Call("dense out_dtype vs out", lambda: gemm(a, b, out, out_dtype=F32), ("out_dtype",))

    def num_sms() -> Call:
        a, b = mk.dense()
        bad = mk.choice([0, -1, 133, 10**6, 66.0, True, False, "66", [66]])  # CPU tensors: 1 to 132
        if mk.rng.random() < 0.5:
            return Call(f"dense num_sms={bad!r}", lambda: gemm(a, b, num_sms=bad), ("num_sms",))
        out = torch.empty(a[0].shape[0], b[0].shape[0], dtype=BF16)
        return Call(f"dense num_sms={bad!r} with out", lambda: gemm(a, b, out, num_sms=bad), ("num_sms",))

    def device() -> Call:
        a, b = mk.dense()
        which = mk.choice(["b[1]", "a[1]", "out"])
        if which == "out":
            out = torch.empty(a[0].shape[0], b[0].shape[0], dtype=BF16, device=META)
            return Call("dense out on meta", lambda: gemm(a, b, out), ("out",))
        if which == "a[1]":
            return Call("dense a[1] on meta", lambda: gemm((a[0], a[1].to(META)), b), ("a[1]",))
        return Call("dense b[1] on meta", lambda: gemm(a, (b[0], b[1].to(META))), ("b[1]",))

    def requires_grad() -> Call:
        a, b = mk.dense()
        if mk.rng.random() < 0.5:
            return Call("dense a[1] requires grad", lambda: gemm((a[0], a[1].requires_grad_()), b), ("a[1]",))
        out = torch.empty(a[0].shape[0], b[0].shape[0], requires_grad=True)
        return Call("dense out requires grad", lambda: gemm(a, b, out), ("out",))

    def huge() -> Call:
        rows = mk.choice([2**31, 2**31 + 7, 2**33])
        big = (torch.empty(rows, 128, dtype=FP8, device=META), torch.empty(rows, 1, device=META))
        small = (torch.empty(8, 128, dtype=FP8, device=META), torch.empty(8, 1, device=META))
        if mk.rng.random() < 0.5:
            sfb = torch.empty(1, 1, device=META)
            return Call(f"dense M={rows}", lambda: gemm(big, (small[0], sfb)), ("a[0]",))
        big_b = (big[0], torch.empty(-(-rows // 128), 1, device=META))
        return Call(f"dense N={rows}", lambda: gemm(small, big_b), ("b[0]",))

    return [not_a_pair, member_not_tensor, operand_dtype, scale_dtype, operand_rank, k_mismatch, scale_shape,
            k_not_16, operand_misaligned, operand_strides, out_layout, out_layout, out_overlap, out_overlap, out_dtype,
            num_sms, device, requires_grad, huge]


def _grouped_families(mk: Maker) -> list[Callable[[], Call]]:
    contiguous, psum_fn = deepgemm.m_grouped_fp8_gemm_nt_contiguous, deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum
    masked = deepgemm.m_grouped_fp8_gemm_nt_masked

    def psum_of(segments: list[int]) -> torch.Tensor:
        ends, start = [], 0
        for count in segments:
            ends.append(start + count)
            start += -(-count // 128) * 128
        return torch.tensor(ends, dtype=torch.int32)

    def contiguous_operands() -> Call:
        a, b, out, m_indices, _ = mk.contiguous()
        kind = mk.choice(["b rank", "b[1] shape", "a[1] shape", "K mismatch", "out shape", "out dtype", "M_total"])
        if kind == "b rank":
            return Call("contiguous b[0] 2-D", lambda: contiguous(a, (b[0][0], b[1][0]), out, m_indices), ("b[0]",))
        if kind == "b[1] shape":
            bad = (b[0], torch.ones(b[1].shape[0] + 1, *b[1].shape[1:]))
            return Call("contiguous b[1] shape", lambda: contiguous(a, bad, out, m_indices), ("b[1]",))
        if kind == "a[1] shape":
            bad_a = (a[0], torch.ones(a[1].shape[0], a[1].shape[1] + 1))
            return Call("contiguous a[1] shape", lambda: contiguous(bad_a, b, out, m_indices), ("a[1]",))
        if kind == "K mismatch":
            other = mk.grouped_b(b[0].shape[0], b[0].shape[1], a[0].shape[1] + 16)
            return Call("contiguous K mismatch", lambda: contiguous(a, other, out, m_indices), ("a[0]", "b[0]"))
        if kind == "out shape":
            bad_out = out[:, :-4] if out.shape[1] > 4 else torch.empty(out.shape[0] + 1, out.shape[1])
            return Call("contiguous out shape", lambda: contiguous(a, b, bad_out, m_indices), ("out",))
        if kind == "out dtype":
            bad_out = out.to(mk.choice([torch.float16, torch.float64]))
            return Call("contiguous out dtype", lambda: contiguous(a, b, bad_out, m_indices), ("out",))
        rows = a[0].shape[0] - mk.rng.randint(1, 64)
        short = (a[0][:rows], a[1][:rows])
        return Call("contiguous M_total % 128", lambda: contiguous(short, b, out[:rows], m_indices[:rows]), ("a[0]",))

    def grouping_tensor() -> Call:
        a, b, out, m_indices, segments = mk.contiguous()
        kind = mk.choice(["int64", "length", "strided", "list", "meta", "psum length", "psum int64", "psum list"])
        if kind == "int64":
            return Call("m_indices int64", lambda: contiguous(a, b, out, m_indices.long()), ("m_indices",))
        if kind == "length":
            return Call("m_indices length", lambda: contiguous(a, b, out, m_indices[:-1]), ("m_indices",))
        if kind == "strided":
            spread = torch.zeros(2 * m_indices.numel(), dtype=torch.int32)[::2]
            return Call("m_indices strided", lambda: contiguous(a, b, out, spread), ("m_indices",))
        if kind == "list":
            return Call("m_indices list", lambda: contiguous(a, b, out, m_indices.tolist()), ("m_indices",))
        if kind == "meta":
            return Call("m_indices on meta", lambda: contiguous(a, b, out, m_indices.to(META)), ("m_indices",))
        psum = psum_of(segments)
        if kind == "psum length":
            longer = torch.cat([psum, psum[-1:]])
            return Call("psum length", lambda: psum_fn(a, b, out, longer), ("psum",))
        if kind == "psum int64":
            return Call("psum int64", lambda: psum_fn(a, b, out, psum.long()), ("psum",))
        return Call("psum list", lambda: psum_fn(a, b, out, psum.tolist()), ("psum",))

    def contiguous_layout() -> Call:
        kind = mk.choice(["K", "a misaligned", "out transposed", "b not stacked", "out row stride",
                          "psum out transposed"])
        if kind == "K":
            a, b, out, m_indices, _ = mk.contiguous(k=mk.bad_k())
            return Call(f"contiguous K={a[0].shape[1]}", lambda: contiguous(a, b, out, m_indices), ("a[0]",))
        a, b, out, m_indices, segments = mk.contiguous()
        m_total, n = out.shape
        if kind == "a misaligned":
            bad = (mk.offset(a[0]), a[1])
            return Call("contiguous a[0] misaligned", lambda: contiguous(bad, b, out, m_indices), ("a[0]",))
        if kind in ("out transposed", "psum out transposed"):
            bad_out = torch.empty(n, m_total, dtype=out.dtype).t()
            if kind == "psum out transposed":
                psum = psum_of(segments)
                return Call("psum out transposed", lambda: psum_fn(a, b, bad_out, psum), ("out",))
            return Call("contiguous out transposed", lambda: contiguous(a, b, bad_out, m_indices), ("out",))
        if kind == "out row stride":
            bad_out = torch.empty(m_total, n + 1, dtype=F32)[:, :n]
            return Call("contiguous out row stride", lambda: contiguous(a, b, bad_out, m_indices), ("out",))
        groups, _, k = b[0].shape
        loose = mk.fp8(groups, n + 8, k)[:, :n]
        if groups == 1:
            loose = mk.fp8(1, n, 2 * k)[:, :, ::2]
        return Call("contiguous b[0] not stacked", lambda: contiguous(a, (loose, b[1]), out, m_indices), ("b[0]",))

    def contiguous_overlap() -> Call:
        a, b, out, m_indices, _ = mk.contiguous()
        m_total, n = out.shape
        kind = mk.choice(["m_indices", "a[1]", "broadcast"])
        if kind == "m_indices":
            buffer = torch.zeros(m_total + m_total * n)
            shared = buffer[:m_total].view(torch.int32)
            shared.copy_(m_indices)
            bad_out = buffer[m_total // 2:m_total // 2 + m_total * n].view(m_total, n)
            return Call("contiguous out overlaps m_indices", lambda: contiguous(a, b, bad_out, shared), ("out",))
        if kind == "a[1]":
            buffer = torch.zeros(a[1].numel() + m_total * n)
            shared = buffer[:a[1].numel()].view(a[1].shape)
            shared.copy_(a[1])
            bad_out = buffer[:m_total * n].view(m_total, n)
            return Call("contiguous out overlaps a[1]", lambda: contiguous((a[0], shared), b, bad_out, m_indices),
                        ("out",))
        bad_out = torch.zeros(1, n).expand(m_total, n)
        return Call("contiguous out broadcast", lambda: contiguous(a, b, bad_out, m_indices), ("out",))

    def masked_hint() -> Call:
        a, b, out, masked_m, _ = mk.masked()
        bad = mk.choice([0, -5, 64.0, "64", True, None, 2.5])
        return Call(f"masked expected_m={bad!r}", lambda: masked(a, b, out, masked_m, bad), ("expected_m",))

    def masked_grouping() -> Call:
        a, b, out, masked_m, expected = mk.masked()
        kind = mk.choice(["int64", "length", "list", "strided", "meta"])
        bad: object
        if kind == "int64":
            bad = masked_m.long()
        elif kind == "length":
            bad = torch.cat([masked_m, masked_m[:1]])
        elif kind == "list":
            bad = masked_m.tolist()
        elif kind == "strided":
            bad = torch.zeros(2 * masked_m.numel(), dtype=torch.int32)[::2]
            if masked_m.numel() == 1:
                bad = torch.zeros(2, dtype=torch.int32)[1:]  # one element: contiguous; make it 2-D instead
                bad = bad.view(1, 1)
        else:
            bad = masked_m.to(META)
        return Call(f"masked_m {kind}", lambda: masked(a, b, out, bad, expected), ("masked_m",))

    def masked_shapes() -> Call:
        kind = mk.choice(["max_m", "groups", "K", "K=0", "out shape", "a[1] shape"])
        if kind == "K":
            a, b, out, masked_m, expected = mk.masked(k=mk.bad_k())
            return Call(f"masked K={a[0].shape[2]}", lambda: masked(a, b, out, masked_m, expected), ("a[0]",))
        if kind == "K=0":
            a, b, out, masked_m, expected = mk.masked(k=16)
            a0 = (a[0][:, :, :0], torch.ones(*a[1].shape[:2], 0))
            b0 = (b[0][:, :, :0], torch.ones(*b[1].shape[:2], 0))
            return Call("masked K=0", lambda: masked(a0, b0, out, masked_m, expected), ("a[0]",))
        a, b, out, masked_m, expected = mk.masked()
        groups, max_m, k = a[0].shape
        if kind == "max_m":
            rows = max_m - mk.rng.randint(1, 63)
            short = (a[0][:, :rows].contiguous(), a[1][:, :rows])
            return Call("masked max_m % 64", lambda: masked(short, b, out[:, :rows], masked_m, expected), ("a[0]",))
        if kind == "groups":
            extra = mk.grouped_b(groups + 1, b[0].shape[1], k)
            return Call("masked groups mismatch", lambda: masked(a, extra, out, masked_m, expected), ("a[0]", "b[0]"))
        if kind == "out shape":
            bad_out = torch.zeros(groups, max_m, b[0].shape[1] + 8, dtype=out.dtype)
            return Call("masked out shape", lambda: masked(a, b, bad_out, masked_m, expected), ("out",))
        bad_a = (a[0], torch.ones(groups, max_m + 1, a[1].shape[2]))
        return Call("masked a[1] shape", lambda: masked(bad_a, b, out, masked_m, expected), ("a[1]",))

    def masked_layout() -> Call:
        a, b, out, masked_m, expected = mk.masked()
        groups, max_m, k = a[0].shape
        n = b[0].shape[1]
        kind = mk.choice(["a not stacked", "out not stacked", "out misaligned", "out overlaps masked_m",
                          "out row stride", "b misaligned"])
        if kind == "a not stacked":
            loose = mk.fp8(groups, max_m, 2 * k)[:, :, ::2] if groups == 1 else mk.fp8(groups, 2 * max_m, k)[:, :max_m]
            return Call("masked a[0] not stacked", lambda: masked((loose, a[1]), b, out, masked_m, expected), ("a[0]",))
        if kind == "out not stacked":
            loose_out = torch.zeros(groups, max_m, 2 * n, dtype=out.dtype)[:, :, ::2]
            return Call("masked out not stacked", lambda: masked(a, b, loose_out, masked_m, expected), ("out",))
        if kind == "out misaligned":
            return Call("masked out misaligned", lambda: masked(a, b, mk.offset(out), masked_m, expected), ("out",))
        if kind == "out row stride":
            padded = torch.zeros(groups, max_m, n + 1, dtype=F32)[:, :, :n]
            return Call("masked out row stride", lambda: masked(a, b, padded, masked_m, expected), ("out",))
        if kind == "b misaligned":
            return Call("masked b[0] misaligned", lambda: masked(a, (mk.offset(b[0]), b[1]), out, masked_m, expected),
                        ("b[0]",))
        holder = torch.zeros(groups * max_m * n)
        shared_out = holder.view(groups, max_m, n)
        shared_m = holder.view(torch.int32)[:groups]
        shared_m.copy_(masked_m)
        return Call("masked out overlaps masked_m", lambda: masked(a, b, shared_out, shared_m, expected), ("out",))

    return [contiguous_operands, grouping_tensor, contiguous_layout, contiguous_overlap, masked_hint, masked_grouping,
            masked_shapes, masked_layout]


def _kgrouped_families(mk: Maker) -> list[Callable[[], Call]]:
    fn = deepgemm.k_grouped_fp8_gemm_tn_contiguous

    def ks_values() -> Call:
        a, b, out, ks = mk.kgrouped()
        kind = mk.choice(["float", "bool", "sum", "multiple", "negative", "string", "2-D tensor", "float tensor"])
        bad: object
        if kind == "float":
            bad, names = [float(ks[0])] + ks[1:], ("ks[0]",)
        elif kind == "bool":
            bad, names = [True] + ks[1:], ("ks[0]",)
        elif kind == "sum":
            bad, names = ks + [128], ("ks", "out")
        elif kind == "multiple":
            g = mk.rng.randrange(len(ks))
            bad, names = list(ks), (f"ks[{g}]",)
            bad[g] = ks[g] + mk.rng.randint(1, 127)  # type: ignore[index]
        elif kind == "negative":
            bad, names = [-128] + ks[1:], ("ks[0]",)
        elif kind == "string":
            bad, names = "128", ("ks",)
        elif kind == "2-D tensor":
            bad, names = torch.tensor([ks]), ("ks",)
        else:
            bad, names = torch.tensor(ks, dtype=F32), ("ks",)
        return Call(f"k-grouped ks {kind}", lambda: fn(a, b, out, bad), names)

    def tensors() -> Call:
        a, b, out, ks = mk.kgrouped()
        groups, m, n = out.shape
        kind = mk.choice(["out dtype", "out shape", "c shape", "c dtype", "b[1] shape", "K_total", "grad c",
                          "c meta"])
        if kind == "out dtype":
            return Call("k-grouped out bf16", lambda: fn(a, b, out.to(BF16), ks), ("out",))
        if kind == "out shape":
            return Call("k-grouped out shape", lambda: fn(a, b, torch.empty(groups, m, n + 1), ks), ("out",))
        if kind == "c shape":
            return Call("k-grouped c shape", lambda: fn(a, b, out, ks, torch.empty(groups + 1, m, n)), ("c",))
        if kind == "c dtype":
            return Call("k-grouped c dtype", lambda: fn(a, b, out, ks, torch.empty(groups, m, n, dtype=BF16)), ("c",))
        if kind == "b[1] shape":
            return Call("k-grouped b[1] shape", lambda: fn(a, (b[0], b[1][:, :-1]), out, ks), ("b[1]",))
        if kind == "K_total":
            k_total = a[0].shape[1] + mk.rng.randint(1, 127)
            a2 = (mk.fp8(m, k_total), mk.scales(m, -(-k_total // 128)))
            b2 = (mk.fp8(n, k_total), mk.scales(n, -(-k_total // 128)))
            return Call("k-grouped K_total % 128", lambda: fn(a2, b2, out, ks), ("a[0]",))
        if kind == "grad c":
            c = torch.zeros(groups, m, n, requires_grad=True)
            return Call("k-grouped c requires grad", lambda: fn(a, b, out, ks, c), ("c",))
        return Call("k-grouped c on meta", lambda: fn(a, b, out, ks, torch.empty(groups, m, n, device=META)), ("c",))

    def layout() -> Call:
        a, b, out, ks = mk.kgrouped()
        groups, m, n = out.shape
        kind = mk.choice(["out transposed", "c transposed", "out misaligned", "c misaligned", "a strided",
                          "c overlaps out", "out overlaps a[1]", "out broadcast"])
        if kind == "out transposed":
            return Call("k-grouped out transposed", lambda: fn(a, b, torch.empty(groups, n, m).transpose(1, 2), ks),
                        ("out",))
        if kind == "c transposed":
            c = torch.empty(groups, n, m).transpose(1, 2)
            return Call("k-grouped c transposed", lambda: fn(a, b, out, ks, c), ("c",))
        if kind == "out misaligned":
            return Call("k-grouped out misaligned", lambda: fn(a, b, mk.offset(out), ks), ("out",))
        if kind == "c misaligned":
            return Call("k-grouped c misaligned", lambda: fn(a, b, out, ks, mk.offset(torch.ones(groups, m, n))),
                        ("c",))
        if kind == "a strided":
            strided = (mk.fp8(m, 2 * a[0].shape[1])[:, ::2], a[1])
            return Call("k-grouped a[0] strided", lambda: fn(strided, b, out, ks), ("a[0]",))
        if kind == "c overlaps out":
            storage = torch.ones((groups + 1) * m * n)
            shift = mk.rng.randint(1, m * n) // 4 * 4 or 4
            out2 = storage[:groups * m * n].view(groups, m, n)
            c = storage[shift:shift + groups * m * n].view(groups, m, n)
            return Call("k-grouped c partially overlaps out", lambda: fn(a, b, out2, ks, c), ("out", "c"))
        if kind == "out broadcast":
            return Call("k-grouped out broadcast", lambda: fn(a, b, torch.zeros(groups, 1, n).expand(groups, m, n), ks),
                        ("out",))
        holder = torch.zeros(a[1].numel() + groups * m * n)
        sfa = holder[:a[1].numel()].view(a[1].shape)
        sfa.copy_(a[1])
        out2 = holder[:groups * m * n].view(groups, m, n)
        return Call("k-grouped out overlaps a[1]", lambda: fn((a[0], sfa), b, out2, ks), ("out",))

    return [ks_values, tensors, layout, layout]


def _quant_families(mk: Maker) -> list[Callable[[], Call]]:
    token, block = deepgemm.quantize_per_token_group, deepgemm.quantize_per_block

    def quantize_input() -> Call:
        fn, name = mk.choice([(token, "x"), (block, "w")])
        kind = mk.choice(["dtype", "rank", "list", "grad", "numpy"])
        x = mk.randn(mk.rng.randint(1, 40), 16 * mk.rng.randint(1, 20))
        bad: object
        if kind == "dtype":
            bad = x.to(mk.choice([torch.int32, torch.int64, torch.uint8, torch.float64, FP8, torch.bool]))
        elif kind == "rank":
            bad = mk.choice([x.unsqueeze(0), x[0], x.sum()])
        elif kind == "list":
            bad = x.tolist()
        elif kind == "numpy":
            bad = x.numpy()
        else:
            bad = x.clone().requires_grad_()
        return Call(f"{fn.__name__} {name} {kind}", lambda: fn(bad), (name,))

    def group_argument() -> Call:
        x = mk.randn(mk.rng.randint(1, 40), 256)
        if mk.rng.random() < 0.5:
            bad = mk.choice([0, 16, 100, 2048, 128.0, True, "128", None, -128])
            return Call(f"quantize_per_token_group group_size={bad!r}", lambda: token(x, bad), ("group_size",))
        bad = mk.choice([0, 16, 256, 96, 128.0, True, "128", None])
        return Call(f"quantize_per_block block={bad!r}", lambda: block(x, bad), ("block",))

    def quantize_size() -> Call:
        kind = mk.choice(["rows", "cols", "k blocks", "grid"])
        if kind == "rows":
            fn, name = mk.choice([(token, "x"), (block, "w")])
            x = torch.empty(mk.choice([2**31, 2**32, 2**32 + 1]), 128, device=META)
            return Call(f"{fn.__name__} {x.shape[0]} rows", lambda: fn(x), (name,))
        if kind == "cols":
            fn, name = mk.choice([(token, "x"), (block, "w")])
            x = torch.empty(1, 2**31 + 128 * mk.rng.randint(0, 8), device=META)
            return Call(f"{fn.__name__} {x.shape[1]} columns", lambda: fn(x, 1024 if fn is token else 128), (name,))
        if kind == "k blocks":
            size = mk.choice([32, 64, 128])
            w = torch.empty(mk.rng.randint(1, 4), size * (65535 + mk.rng.randint(1, 1000)), device=META)
            return Call(f"quantize_per_block {w.shape[1] // size} K blocks", lambda: block(w, size), ("w",))
        x = torch.empty(2**30, 32 * mk.rng.randint(40, 64), device=META)
        return Call("quantize_per_token_group grid", lambda: token(x, 32), ("x",))

    def dequantize() -> Call:
        fn = mk.choice([deepgemm.dequantize_per_token_group, deepgemm.dequantize_per_block])
        x = mk.randn(mk.rng.randint(1, 40), 16 * mk.rng.randint(1, 20))
        q_, sf = (token if fn is deepgemm.dequantize_per_token_group else block)(x)
        kind = mk.choice(["sf dtype", "dtype", "q dtype", "sf shape", "group", "q rank", "sf list", "sf meta"])
        if kind == "sf dtype":
            bad_sf = sf.to(mk.choice([torch.float64, BF16, torch.float16, torch.int32]))
            return Call(f"{fn.__name__} sf dtype", lambda: fn(q_, bad_sf), ("sf",))
        if kind == "dtype":
            bad = mk.choice([torch.int32, torch.int64, FP8, torch.bool, "float32", None, torch.complex64])
            return Call(f"{fn.__name__} dtype={bad!r}", lambda: fn(q_, sf, 128, bad), ("dtype",))
        if kind == "q dtype":
            return Call(f"{fn.__name__} q dtype", lambda: fn(q_.float(), sf), ("q",))
        if kind == "sf shape":
            return Call(f"{fn.__name__} sf shape", lambda: fn(q_, torch.ones(sf.shape[0] + 1, sf.shape[1])), ("sf",))
        if kind == "group":
            return Call(f"{fn.__name__} group", lambda: fn(q_, sf, mk.choice([0, 100, 96.0, True])),
                        ("group_size", "block"))
        if kind == "q rank":
            return Call(f"{fn.__name__} q rank", lambda: fn(q_.unsqueeze(0), sf), ("q",))
        if kind == "sf list":
            return Call(f"{fn.__name__} sf list", lambda: fn(q_, sf.tolist()), ("sf",))
        return Call(f"{fn.__name__} sf on meta", lambda: fn(q_, sf.to(META)), ("sf",))

    return [quantize_input, group_argument, quantize_size, quantize_size, dequantize, dequantize]


def _host_families(mk: Maker) -> list[Callable[[], Call]]:
    precompile = deepgemm.precompile_fp8_gemm_nt

    def precompile_sizes() -> Call:
        which = mk.choice(["m", "n", "k"])
        bad = mk.choice([0, -1, -(2**40), 1.5, True, "8", None])
        args = {"m": 128, "n": 256, "k": 512}
        args[which] = bad  # type: ignore[assignment]
        return Call(f"precompile {which}={bad!r}", lambda: precompile(args["m"], args["n"], args["k"]), (which,))

    def precompile_options() -> Call:
        kind = mk.choice(["k", "out_dtype", "num_sms"])
        if kind == "k":
            k = mk.bad_k()
            return Call(f"precompile k={k}", lambda: precompile(128, 256, k), ("k",))
        if kind == "out_dtype":
            bad = mk.choice([torch.float16, torch.float64, "bf16", None])
            return Call(f"precompile out_dtype={bad!r}", lambda: precompile(128, 256, 512, out_dtype=bad), ("out_dtype",))
        bad = mk.choice([0, -1, 133, 10**6, 64.0, True, "132"])
        if torch.cuda.is_available() and bad == 133:
            bad = torch.cuda.get_device_properties(0).multi_processor_count + 1
        return Call(f"precompile num_sms={bad!r}", lambda: precompile(128, 256, 512, num_sms=bad), ("num_sms",))

    def calc_diff() -> Call:
        x = mk.randn(mk.rng.randint(2, 8), mk.rng.randint(2, 8))
        kind = mk.choice(["broadcast row", "transposed", "scalar", "not a tensor"])
        if kind == "broadcast row":
            return Call("calc_diff broadcast", lambda: deepgemm.calc_diff(x, x[:1]), ("x", "y"))
        if kind == "transposed":
            y = x.t() if x.shape[0] != x.shape[1] else x[:, :-1]
            return Call("calc_diff transposed", lambda: deepgemm.calc_diff(x, y), ("x", "y"))
        if kind == "scalar":
            return Call("calc_diff 0-d", lambda: deepgemm.calc_diff(x.sum(), x), ("x", "y"))
        bad = mk.choice([1.0, x.tolist(), x.numpy()])
        if mk.rng.random() < 0.5:
            return Call("calc_diff x not a tensor", lambda: deepgemm.calc_diff(bad, x), ("x",))
        return Call("calc_diff y not a tensor", lambda: deepgemm.calc_diff(x, bad), ("y",))

    def layout_helper() -> Call:
        bad = mk.choice([torch.ones(3, 4, dtype=torch.float64), torch.ones(3), [[1.0]], torch.ones(2, 3, 4)])
        return Call("to_mn_major_tma_aligned", lambda: deepgemm.to_mn_major_tma_aligned(bad), ("sf",))

    return [precompile_sizes, precompile_options, calc_diff, layout_helper]


def malformed_calls(seed: int, count: int = MALFORMED_CALLS) -> list[Call]:
    mk = Maker(seed)
    families = _dense_families(mk) + _grouped_families(mk) + _kgrouped_families(mk) + _quant_families(mk)
    families += _host_families(mk)
    order = [families[i % len(families)] for i in range(count)]
    return [family() for family in order]


# ---------------------------------------------------------------- valid calls


def _dequantized_fp64(q_: torch.Tensor, sf: torch.Tensor, rows_per_scale: int, cols_per_scale: int) -> torch.Tensor:
    """q * sf expanded over its (rows_per_scale x cols_per_scale) blocks, in float64, by plain indexing."""
    rows = torch.arange(q_.shape[0]) // rows_per_scale
    cols = torch.arange(q_.shape[1]) // cols_per_scale
    return q_.double() * sf.double()[rows][:, cols]


def valid_calls(seed: int, count: int = VALID_CALLS) -> list[Call]:
    mk = Maker(seed + 1)

    def dense() -> Call:
        m, n, k = mk.rng.randint(1, 160), mk.rng.randint(1, 300), mk.k16(1, 40)
        given = mk.rng.random() < 0.5
        dtype = mk.choice([BF16, F32])
        if given:
            n = -(-n // 8) * 8
        x = mk.randn(m, k) * torch.exp(mk.randn(m, 1))
        w = mk.randn(n, k)
        a = deepgemm.quantize_per_token_group(x.to(BF16))
        b = deepgemm.quantize_per_block(w.to(BF16))
        if mk.rng.random() < 0.3:
            a = (a[0], a[1].contiguous())  # row-major scales are accepted too

        num_sms = (None, 1, 66, 132)[(m + n + k) % 4]  # (drawn without the generator: the stream stays the same)

        def run() -> None:
            out = deepgemm.fp8_gemm_nt(a, b, torch.empty(m, n, dtype=dtype) if given else None,
                                       out_dtype=None if given else dtype, num_sms=num_sms)
            assert out.shape == (m, n) and out.dtype == dtype
            assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))
        return Call(f"valid dense {m}x{n}x{k} {dtype} num_sms={num_sms}", run, ())

    def contiguous() -> Call:
        a, b, out, m_indices, segments = mk.contiguous()
        use_psum = mk.rng.random() < 0.4

        def run() -> None:
            if use_psum:
                ends, start = [], 0
                for count in segments:
                    ends.append(start + count)
                    start += -(-count // 128) * 128
                deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, torch.tensor(ends, dtype=torch.int32))
            else:
                deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)
            for g in range(b[0].shape[0]):
                rows = (m_indices == g).nonzero().flatten()
                if rows.numel():
                    ag, bg = (a[0][rows], a[1][rows]), (b[0][g], b[1][g])
                    assert_close_to_reference(out[rows], reference_fp64(ag, bg), reference_abs_fp64(ag, bg))
            assert (out[m_indices < 0] == 0).all()
        return Call(f"valid contiguous{' psum' if use_psum else ''} {tuple(out.shape)}", run, ())

    def masked() -> Call:
        a, b, out, masked_m, expected = mk.masked()

        def run() -> None:
            deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected)
            for g, count in enumerate(masked_m.tolist()):
                if count:
                    ag, bg = (a[0][g, :count], a[1][g, :count]), (b[0][g], b[1][g])
                    assert_close_to_reference(out[g, :count], reference_fp64(ag, bg), reference_abs_fp64(ag, bg))
        return Call(f"valid masked {tuple(out.shape)}", run, ())

    def kgrouped() -> Call:
        a, b, out, ks = mk.kgrouped()
        c = mk.randn(*out.shape) if mk.rng.random() < 0.5 else None
        in_place = c is not None and mk.rng.random() < 0.5

        def run() -> None:
            target = c.clone() if in_place and c is not None else out
            deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, target, ks, target if in_place else c)
            a64, b64 = _dequantized_fp64(a[0], a[1], 1, 128), _dequantized_fp64(b[0], b[1], 1, 128)
            begin = 0
            for g, k in enumerate(ks):
                expected = a64[:, begin:begin + k] @ b64[:, begin:begin + k].t()
                if c is not None:
                    expected = expected + c[g].double()
                assert deepgemm.calc_diff(target[g], expected) < 1e-6 or (expected == 0).all()
                assert torch.allclose(target[g].double(), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
                begin += k
        return Call(f"valid k-grouped ks={ks}{' c' if c is not None else ''}{' in place' if in_place else ''}", run, ())

    def quantize() -> Call:
        m, k = mk.rng.randint(1, 80), mk.rng.randint(1, 600)
        dtype = mk.choice([F32, BF16, torch.float16])
        x = (mk.randn(m, k) * 4).to(dtype)
        per_block = mk.rng.random() < 0.5
        size = mk.choice([32, 64, 128]) if per_block else mk.choice([32, 128, 256])

        def run() -> None:
            if per_block:
                q_, sf = deepgemm.quantize_per_block(x, size)
                back = _dequantized_fp64(q_, sf, size, size)
                assert torch.equal(deepgemm.dequantize_per_block(q_, sf, size, torch.float64), back)
                scale = sf.double()[torch.arange(m) // size][:, torch.arange(k) // size]
            else:
                q_, sf = deepgemm.quantize_per_token_group(x, size)
                back = _dequantized_fp64(q_, sf, 1, size)
                assert torch.equal(deepgemm.dequantize_per_token_group(q_, sf, size, torch.float64), back)
                scale = sf.double()[:, torch.arange(k) // size]
            error = (back - x.double()).abs()
            assert (error <= 2**-4 * x.double().abs() + scale * 2**-9).all()
        return Call(f"valid {'quantize_per_block' if per_block else 'quantize_per_token_group'} {m}x{k} {dtype}",
                    run, ())

    makers = [dense] * 4 + [contiguous, masked, kgrouped, quantize, quantize]
    return [makers[i % len(makers)]() for i in range(count)]


# ---------------------------------------------------------------- the test


def _names_argument(message: str, names: tuple[str, ...]) -> bool:
    spelled = [name for name in names for name in (name, *ALIASES.get(name, ()))]
    return any(f"'{name}'" in message for name in spelled)


def classify(call: Call) -> tuple[str, str]:
    try:
        call.run()
    except TYPED as error:
        if not call.names or _names_argument(str(error), call.names):
            return ("typed, names the argument" if call.names else "valid call raised"), f"{type(error).__name__}"
        return "typed, argument not named", f"{type(error).__name__}: {error}"
    except Exception as error:  # noqa: BLE001 - counted, then reported
        return "other exception", f"{type(error).__name__}: {str(error)[:200]}"
    return ("silent success" if call.names else "valid, matches float64"), ""


@pytest.fixture
def no_compiles(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """precompile calls that got past validation are recorded, not compiled (they would be silent successes)."""
    compiled: list[object] = []

    class Compiled:
        resources = None
        cubin_path = "not compiled"

    def fake_compile(spec: object) -> Compiled:
        compiled.append(spec)
        return Compiled()

    monkeypatch.setattr(gemm_api, "compile_spec", fake_compile)
    return compiled


def test_malformed_and_valid_calls(no_compiles: list[object], capsys: pytest.CaptureFixture[str]) -> None:
    print(f"seed={SEED} (DEEPGEMM_FUZZ_SEED)")
    counts: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    malformed = malformed_calls(SEED)
    for call in malformed:
        outcome, detail = classify(call)
        counts[outcome] += 1
        if outcome != "typed, names the argument":
            problems.append(f"[malformed] {call.label}: {outcome} {detail}")
    valid = valid_calls(SEED)
    for call in valid:
        outcome, detail = classify(call)
        counts[outcome] += 1
        if outcome != "valid, matches float64":
            problems.append(f"[valid] {call.label}: {outcome} {detail}")
    labels = collections.Counter(call.label.split(" ")[0] for call in malformed)
    with capsys.disabled():
        print(f"\nmalformed-call fuzz, seed {SEED}: {len(malformed)} malformed calls over {len(labels)} functions, "
              f"{len(valid)} valid calls")
        for outcome in ("typed, names the argument", "typed, argument not named", "silent success", "other exception",
                        "valid, matches float64", "valid call raised"):
            print(f"  {outcome:28s} {counts[outcome]}")
        for problem in problems:
            print("  " + problem)
    assert len(malformed) >= 250 and len(valid) >= 100
    assert not problems, "\n".join(problems)
