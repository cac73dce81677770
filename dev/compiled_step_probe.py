"""The FP8 training step under torch.compile on the GPU, piece by piece against eager: the weight quantizer's
outputs compiled, the whole layer under aot_eager and inductor (with and without a bias),
and the backward's ops alone. Prints which outputs match bit for bit (python dev/compiled_step_probe.py; set
TORCH_LOGS=output_code,aot_graphs TORCH_LOGS_OUT=FILE for the graphs)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from deepgemm.nn import Fp8TrainingLinear  # noqa: E402

print("torch", torch.__version__)
torch.manual_seed(0)
B = torch.bfloat16
def show(name, a, b):
    a, b = a.float().cpu(), b.float().cpu()
    print(f"{name}: equal={torch.equal(a, b)} absmax compiled={a.abs().max().item():.4g} eager={b.abs().max().item():.4g}", flush=True)

# 1. the weight quantizer + transposed scales, compiled vs eager
w = torch.randn(512, 1024, device="cuda", dtype=B)
def f(w):
    q, sf, qt, sft = torch.ops.deepgemm.quantize_per_block_transposed(w)
    return q, sf, qt, sft, sf.t().contiguous()
e = f(w); c = torch.compile(f, fullgraph=True)(w)
for i, (a, b) in enumerate(zip(c, e)): show(f"wq[{i}]", a, b); print(a.shape, a.stride(), b.stride())

# 2. the layer
for backend, bias in (("aot_eager", True), ("inductor", True), ("inductor", False)):
    torch._dynamo.reset()
    layer = Fp8TrainingLinear(1024, 512, device="cuda", dtype=B, bias=bias)
    x = torch.randn(384, 1024, device="cuda", dtype=B); dy = torch.randn(384, 512, device="cuda", dtype=B)
    xg = x.clone().requires_grad_(); y = layer(xg); y.backward(dy)
    eg = (y.detach(), xg.grad.clone(), layer.weight.grad.clone())
    layer.zero_grad()
    xc = x.clone().requires_grad_(); yc = torch.compile(layer, fullgraph=True, backend=backend)(xc); yc.backward(dy)
    torch.cuda.synchronize()
    print(backend); show(f"bias={bias} y", yc.detach(), eg[0]); show(f"bias={bias} dx", xc.grad, eg[1]); show(f"bias={bias} dw", layer.weight.grad, eg[2])

# 3. the backward pieces alone, compiled
w_q, w_sf, w_qt, w_sft = torch.ops.deepgemm.quantize_per_block_transposed(w)
def g(dy, w_qt, w_sft):
    q, sf = torch.ops.deepgemm.quantize_per_token_group(dy, 128)
    qt, sft = torch.ops.deepgemm.quantize_transposed(dy, 384)
    return torch.ops.deepgemm.fp8_gemm_nt(q, sf, w_qt, w_sft, B, None), qt, sft
dy = torch.randn(384, 512, device="cuda", dtype=B)
e = g(dy, w_qt, w_sft); c = torch.compile(g, fullgraph=True)(dy, w_qt, w_sft)
for i, (a, b) in enumerate(zip(c, e)): show(f"bw[{i}]", a, b)
