"""A GPU's compile, on a machine without one: `python -m scripts.gpu_dryrun` (see __main__.py).

GPU time is short, and a compile error costs a GPU session's minutes before the first step.
Most such errors are in what torch.compile makes of the CUDA code paths and in Triton's
compiler, and neither needs a GPU to run: only the pretence that there is one.

- `host_cuda.cpp`, preloaded into a CPU-only torch, adds a CUDA device whose memory is host
  memory: tensors made on "cuda" exist, autograd and the device guards accept them, ops on them
  run on the CPU (matrix products only allocate their result).
- `fake_gpu.py` makes torch.cuda, inductor and Triton's driver report an H100 (sm_90).

Then the preset's step runs as on a GPU: dynamo traces the CUDA branches (FlexAttention,
`torch._scaled_mm`), inductor generates the Triton kernels it would generate there, and Triton
compiles each to PTX and a cubin with its own ptxas. Launches are skipped. What this cannot
see: errors at run time on the GPU (an illegal address, out of memory, a NaN), and choices
that inductor makes by timing candidates (every candidate times the same here).
"""
