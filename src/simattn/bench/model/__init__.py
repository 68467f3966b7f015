"""``simattn bench model``: what SimA saves in whole models.

For every combination of registered model × attention kind × input size × precision it measures, in a fresh
subprocess per combination (``python -m simattn.bench.model.workers SPEC``, one JSON line back on stdout) so that
one model's allocations, caches and thread pools do not disturb the next (freed memory is kept by the allocator,
see :func:`simattn.utils.timing.keep_freed_memory`, so calls do not page-fault their buffers in):

* inference: batch-1 latency (p50, p90) and batched throughput;
* training step (forward + backward + AdamW step): batch-1 latency and batched throughput;
* exp-like evaluations and op calls per forward, FLOPs (total and attention core) — :mod:`simattn.bench.counters`;
* peak memory of a forward and of a training step (CUDA: allocator peak; CPU: deterministic storage accounting);
* with latency, on the eager model: the attention share, the measured fraction of the forward's time spent inside
  the attention modules (:func:`attention_share`: forward hooks time each attention module, with and without its
  qkv/output projections, within the same calls; not an estimate from FLOPs).

``--img-size`` takes N (N×N) or HxW (``1024x2048``; ViT-style models are built for that size). ``--head fpn`` or
``--head upernet`` wraps each ``--models`` backbone in that segmenter (:mod:`simattn.models.segmentation`,
registered as ``semantic_fpn``/``upernet``, 150 classes as ADE20K; ``--attn`` reaches the backbone), whose logits
are per pixel at the input size; its training step takes a per-pixel cross-entropy. Sizes must be multiples of the
patch size (and of 32 for a segmenter), checked before any work.

Every timing comes with its p10 and p90 (throughput: batch / p90 and batch / p10), and a one-line warning names
the timings whose p10-p90 range is wider than :data:`simattn.bench.report.WIDE_SPREAD` of the median.

What runs the model (the ``runtime`` column): ``eager`` PyTorch, ``compiled`` (``--compile``, ``torch.compile``;
the first, compiling call is part of the warm-up), or the runtime of a deployment format (:mod:`simattn.deploy`:
the model exported, and opened, by the same registry entry ``simattn export`` uses): ``onnxruntime``,
``executorch`` (XNNPACK), ``openvino`` (CPU plugin, fp32), ``litert`` (TFLite), with ``channels-last`` added under
``--channels-last``. ``--runtime`` takes several; ``--int8`` adds an int8 row for each runtime whose format has
static int8 (onnxruntime: QDQ; ExecuTorch: PT2E), calibrated on digits. Every exported graph is checked against
PyTorch (``runtime_max_abs_diff``) and is inference only. Every runtime is held to ``--threads`` (torch's intra-op
pool, onnxruntime's intra-op threads, ExecuTorch's XNNPACK pool, OpenVINO's inference threads), and the CPU's vector
features (AVX2, AVX-512, VNNI, AMX) are recorded, since int8 speed depends on them. Exp/FLOP counts and memory are
always those of the eager model.

The floor (with latency; on by default when ``--runtime`` names a runtime besides torch, ``--floor``/``--no-floor``
to choose): each row's model reduced to its ``nn.Linear`` layers, each applied to an input of the shape it sees in
the model (:func:`linear_floor`; a convolution patch embedding is not a linear and is left out), run through the
same runtime, precision and threads and timed in the same worker (``floor_ms``; ``of_floor`` = the model's p50 /
the floor's). On onnxruntime and ExecuTorch a separate profiled run (:func:`runtime_profile`) gives the shares of
the runtime's time outside matmul-type kernels (``non_linear_share``) and, on ExecuTorch, outside XNNPACK's
delegate calls (``non_delegated_share``). ``--floor`` also adds the attention-free floor to each configuration on
torch: a row labelled ``floor``, the same network with every attention core replaced by a zero-cost stand-in
(:func:`~.runner.without_attention`), measured as the other rows are (training and inference, eager or compiled,
classifier or segmenter); ``floor_ratios`` gives each row's time over it.

A configuration that fails is a row whose ``error`` is its cause (the exception's first line; on CUDA with the
kernel's device-side assertion), and the next starts in a fresh process. A segmenter's training step takes its
per-pixel loss in chunks where the logits are more than one CUDA loss call indexes
(:func:`simattn.engine.losses.pixel_cross_entropy`).

Results go to ``bench_model.{json,csv,md,png}`` (the figure: bars per runtime and precision for one input size,
lines against size for several). ``--fixed-order`` runs SimA as (q̂k̂ᵀ)v, the paper's way of
isolating the cost of exp. ``--attn`` lists the kinds (``LABEL=KIND`` runs a kind twice under another name),
``--attn-kwargs`` gives each its options (``softmax.fused=false`` is the explicit N×N softmax, whose memory grows
quadratically; fused SDPA's does not). Examples::

    simattn bench model --models sima_deit_small_patch16_224 --attn sima softmax --img-size 224 512 1024
    simattn bench model --attn sima softmax explicit=softmax --attn-kwargs explicit.fused=false \\
        --measure memory counts --img-size 224 384 512
    simattn bench model --attn sima softmax --compile --measure latency throughput
    simattn bench model --attn sima softmax --head fpn --img-size 512 1024 1024x2048 --measure latency memory

On a GPU (``--device cuda``; bf16 autocast unless ``--precision`` says otherwise, over the forward and loss of a
training step as a GPU user trains, then backward and the optimizer step; peak memory from
``torch.cuda.max_memory_allocated``), ``--preset gpu`` is the table GPU users read: DeiT-S with SimA against its
softmax twin (SDPA, flash where torch picks it) at 224, 512 and 1024 px, and with a Semantic FPN head at 512×512 and
1024×2048; training and inference images/s at a batch that starts at the preset's per-size batch
(:data:`~.cli.GPU_GRID`) and halves on CUDA out-of-memory until a step fits (``--fill-batch``; the rows name the
batch, ``train_batch``/``infer_batch``, and its peak memory, ``*_ips_peak_mb``); tables name the GPU, torch and
Triton, and the figure draws SimA against softmax per size. Flags beside the preset still apply, e.g. SimA's
Triton kernels as a third entry::

    simattn bench model --preset gpu --output runs/gpu_table
    simattn bench model --preset gpu --attn sima triton=sima softmax --attn-kwargs triton.backend=triton

Without a CUDA device, ``--device cuda`` stops at once with a one-line error (exit code 2).

The package, one concern per module (imports go down this list):

* :mod:`.spec`: :class:`~.spec.BenchSpec` (one configuration, its options declared once and checked there) and the
  names of sizes and runtimes;
* :mod:`.runner`: the model built (:func:`~.runner.build_model`), deployed for an exported runtime
  (through :func:`simattn.deploy.pipeline.deploy_model`, as ``simattn export`` does), and its timed calls (:class:`~.runner.Runner`);
* :mod:`.probes`: the attention share, the linear floor and the runtime profiles;
* :mod:`.workers`: one configuration measured (:func:`~.workers.measure`), in a subprocess each
  (:func:`~.workers.run_specs`);
* :mod:`.results`: speed-ups, tables (JSON, CSV, markdown) and the figure;
* :mod:`.cli`: the options, parser and ``main`` of ``simattn bench model``.
"""
