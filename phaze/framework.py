"""Training-framework presets: what a framework sets that a run's standard columns do not say.

A published run names its framework far more often than its attention kernel, its collective
overlap or its optimizer sharding. Each preset expands to explicit plan settings, each with the
framework's public default behind it; any explicit setting (a CSV column, a ``--plan`` key, a
sweep key) overrides it. The execution model (:data:`phaze.arch.EXECUTION`) says how the
device's work is issued, which sets the per-kernel overheads; a preset's replaces the chip's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .arch import EXECUTION
from .configio import ConfigError, suggest
from .placement import PlacementOptions
from .plan import (
    CP_COMMS,
    DP_SHARD_NODE,
    LOSSES,
    OPTIMIZERS,
    PIPE_P2P,
    Plan,
    dp_shard_text,
    hides_dp_reduction,
    shared_overlap_conflict,
)
from .workload import BIAS_KERNELS, FP8_CASTS, KV_REPEATS, ROTARY_KERNELS, SOFTMAX_KERNELS, Model


@dataclass(frozen=True)
class Framework:
    """One framework's defaults, as plan settings (see :class:`phaze.plan.Plan`)."""

    name: str
    attention: str              # flash | flash2 | standard
    tp_async: bool              # backward tensor-parallel collectives under one GEMM
    tp_overlap: bool            # tensor-parallel collectives hidden behind the layer's GEMMs
    zero: int                   # ZeRO / FSDP stage of a data-parallel run
    reduce_fp32: bool           # gradients reduced in fp32
    dropout: bool               # dropout layers in the model (Megatron's GPT default 0.1)
    selective: str              # what recompute=selective re-runs: attention (Megatron) | op (torchtitan)
    execution: str              # eager | cuda-graphs | xla (phaze.arch.EXECUTION)
    interleave: bool            # a pipelined run interleaves stages unless it says vp
    source: str
    sp: bool | None = None      # sequence parallelism of a tensor-parallel run that does not say;
                                # None: on (phaze's default, the recipes of NeMo and Megatron-Core)
    selective_recompute: bool = True   # offers a selective recompute (a row without recompute may use it)
    interleaving: bool = True   # has an interleaved pipeline schedule at all (``place`` searches vp)
    interleave_vp: int = 0      # the virtual stages a rank its interleaved schedule runs when a run
                                # names the schedule but not vp (0: the best vp it accepts)
    block_recompute: bool = True    # can re-run some of a stage's layers whole and none of the rest
                                    # (recompute=block; a row without recompute may use it)
    vocab_multiple: int = 0     # pads the vocabulary to a multiple of this per tensor-parallel rank
                                # (Megatron's --make-vocab-size-divisible-by 128); 0: as the model has it
    flop_convention: str = ""   # how its throughput log counts FLOPs (TFLOP/s per GPU): a convention of
                                # phaze.runs.CONVENTIONS; "": model FLOPs
    dp_overlap: bool = True     # the data-parallel gradient reduction runs under the last backward
                                # pass (False: after it, exposed)
    dp_overlap_flat: bool = False   # ... only in a run without pipeline and sequence parallelism
                                    # (after the backward in the others)
    loss: str = "torch"         # its cross-entropy kernels (phaze.plan.LOSSES)
    optimizer: str = "adam"     # its optimizer step's kernels (phaze.plan.OPTIMIZERS)
    bf16_reduce_fp32: bool = False   # a run that is not fp16 accumulates and reduces its gradients
                                     # in fp32 whatever ``reduce_fp32`` says
    fp8_casts: str = "fused"    # where an fp8 run's casts run (phaze.workload.FP8_CASTS): fused into
                                # the norms by Transformer Engine's modules | separate kernels
    bias_kernels: str = "fused"  # where a biased model's bias adds and gradients run
                                 # (phaze.workload.BIAS_KERNELS): GEMM epilogues | separate kernels
    rotary_kernels: str = "fused"  # how a rotary model's rotations run (phaze.workload.ROTARY_KERNELS)
    kv_repeat: str = "grouped"     # how its attention reads grouped-query key/value heads
                                   # (phaze.workload.KV_REPEATS)
    softmax_kernel: str = "fused"  # how its unfused attention's softmax runs (phaze.workload.SOFTMAX_KERNELS)
    pipe_p2p: str = "batched"      # how its pipeline's stages exchange activations (phaze.plan.PIPE_P2P)
    bf16_zero: int | None = None  # the ZeRO stage of a run that is not fp16, when its optimizer
                                  # shards whatever the config says; None: ``zero``
    recompute_modules: tuple[str, ...] = ()   # what its selective recompute re-runs by default
                                              # (Megatron-Core's --recompute-modules); empty: selective
    grad_accum_fusion: bool = True  # adam-megatron: the weight-gradient GEMMs add into the fp32 main
                                    # gradients (False: a hook adds each micro-batch's, tensor by tensor)
    dp_shard: int = 0           # data-parallel ranks of a ZeRO shard group (phaze.plan.Plan.dp_shard):
                                # 0 every rank, DP_SHARD_NODE a node's or pod slice's (hybrid sharding)
    cp_comm: str = "p2p"        # how its context parallelism exchanges K and V (phaze.plan.CP_COMMS)
    fsdp_pp: str = "micro_batch"  # how its FSDP holds a pipeline stage's weights (phaze.plan.FSDP_PP)
    fp8_params: bool = False    # an fp8 run's linear weights held and gathered in fp8 (phaze.plan.Plan.fp8_params)
    shared_overlap: bool = False  # a mixture of experts' shared experts beside its token all-to-alls
                                  # (Megatron-Core's --moe-shared-expert-overlap), where the plan allows it
    precision: str = ""         # what its runs train in when a run does not say (fp16 | bf16 | fp8);
                                # "": phaze's default, bf16
    moe_capacity: float = 0.0   # a mixture of experts' capacity factor where the model gives none
                                # (its recipes drop tokens beyond it, each expert's input padded to
                                # it); 0: the model's (dropless without one)

    @property
    def title(self) -> str:
        """What the preset stands for: its source up to the first colon."""
        return self.source.split(": ", 1)[0]

    def zero_for(self, precision: str) -> int:
        """The ZeRO stage a run at ``precision`` gets by default."""
        return self.bf16_zero if self.bf16_zero is not None and precision != "fp16" else self.zero

    def reduces_fp32(self, precision: str) -> bool:
        """Whether a run at ``precision`` reduces its gradients in fp32 by default."""
        return self.reduce_fp32 or (self.bf16_reduce_fp32 and precision != "fp16")

    def __post_init__(self):
        assert self.execution in EXECUTION, self.execution
        assert self.loss in LOSSES, self.loss
        assert self.optimizer in OPTIMIZERS, self.optimizer
        assert self.fp8_casts in FP8_CASTS, self.fp8_casts
        assert self.bias_kernels in BIAS_KERNELS, self.bias_kernels
        assert self.rotary_kernels in ROTARY_KERNELS, self.rotary_kernels
        assert self.kv_repeat in KV_REPEATS, self.kv_repeat
        assert self.softmax_kernel in SOFTMAX_KERNELS, self.softmax_kernel
        assert self.pipe_p2p in PIPE_P2P, self.pipe_p2p
        assert self.cp_comm in CP_COMMS, self.cp_comm
        assert self.precision in ("", "fp16", "bf16", "fp8"), self.precision



# NeMo 2's performance recipes, as read from nemo_toolkit on PyPI; the two presets differ in the
# precision of the gradient reduction
_NEMO_SOURCE = ("Megatron-Core with Transformer Engine fused attention, tp_comm_overlap on for tensor-parallel "
                "runs (Transformer Engine's userbuffers: the attention's and dense MLP's tensor-parallel "
                "collectives under their GEMMs; Megatron-Core turns them off for the experts, whose "
                "all-to-alls run exposed), {reduce}, the distributed optimizer (Megatron's passes on each "
                "shard), no dropout, "
                "interleaved pipelines (virtual_pipeline_model_parallel_size in the recipes); recompute_method "
                "block re-runs recompute_num_layers layers of each stage whole and none of the rest "
                "(Megatron-Core 0.16 transformer_config.py); selective recompute is Megatron-Core's, "
                "recompute_modules core_attn by default (the core attention, a fused kernel too); its "
                "mixture-of-experts performance recipes drop tokens at a capacity factor of 1.0, each expert's "
                "input padded to it (nemo_toolkit 2.0.0 to 2.6.2: MegatronTokenDropCallback, "
                "moe_expert_capacity_factor 1.0 and moe_pad_expert_input_to_capacity, in the performance_mode "
                "recipes of Mixtral 8x7B and 8x22B and Llama 4 and the performance scripts of Qwen3 30B-A3B "
                "and 235B-A22B; DeepSeek-V3's balances the routing by force on H100 and drops tokens so on "
                "other GPUs: the same load on every expert); its fp8 mixed-precision plugins hold the linear "
                "weights in fp8 and gather them in fp8 (nemo_toolkit 2.0.0 bf16_with_fp8_mixed: fp8_params "
                "True, which sets Transformer Engine's FP8_PARAMETERS and fp8_param_gather; 2.3.0 to 2.6.2: "
                "fp8_param_gather True in each fp8 recipe the performance scripts use); rotary embeddings "
                "through Transformer Engine's fused kernel (apply_rope_fusion True in its Llama, Mixtral and "
                "Nemotron configs, nemo_toolkit 2.6.2 llm/gpt/model/llama.py, mixtral.py, nemotron.py; its "
                "DeepSeek and Qwen configs leave Megatron-Core's False, the unfused formula, which the performance "
                "scripts turn on for DeepSeek-V3 and Qwen3 from nemo_toolkit 2.4.0, pretrain_deepseek_v3.py and "
                "pretrain_qwen3_*.py, apply_rope_fusion True: a run from another script says "
                "rotary_kernels separate); its interleaved pipelines overlap their sends with compute "
                "(MegatronCommOverlapCallback, nemo_toolkit 2.0.0 to 2.6.2 "
                "lightning/pytorch/callbacks/megatron_comm_overlap.py: overlap_p2p_comm True and "
                "batch_p2p_comm False when pp > 1 and vp > 1, batched otherwise; pipe_p2p overlapped); a "
                "mixture of experts' shared experts run beside its token all-to-alls (moe_shared_expert_"
                "overlap True in its DeepSeek and Llama 4 configs, nemo_toolkit 2.6.2 llm/gpt/model/deepseek.py "
                "and llama.py, the only ones with shared experts; off under DeepEP, which the DeepSeek-V3 "
                "performance script runs on H100 and Megatron-Core refuses with it: shared_overlap where the "
                "plan allows it); {loss}")
_NEMO_2024 = Framework("nemo-2024", attention="flash", tp_async=True, tp_overlap=True, zero=1,
                       reduce_fp32=False, dropout=False, selective="attention", execution="eager",
                       interleave=True, vocab_multiple=128, optimizer="adam-megatron", bf16_reduce_fp32=True,
                       recompute_modules=("core_attn",), moe_capacity=1.0, fp8_params=True, loss="fused",
                       pipe_p2p="overlapped", shared_overlap=True,
                       source="NVIDIA NeMo 2 LLM performance recipes of 2024 (containers 24.07 to 24.12, "
                              "nemo_toolkit 2.0 and 2.1): " + _NEMO_SOURCE.format(
                                  reduce="grad_reduce_in_fp32 in its bf16 and fp8 mixed-precision plugins "
                                         "(2.0.0 and 2.1.0: the pretraining performance mode leaves it on)",
                                  loss="Megatron-Core's fused cross entropy (GPTConfig cross_entropy_loss_fusion "
                                       "True, nemo_toolkit 2.0.0 llm/gpt/model/base.py: "
                                       "fused_vocab_parallel_cross_entropy, megatron-core 0.8.0 "
                                       "fusions/fused_cross_entropy.py, three functions compiled by "
                                       "torch.compile from PyTorch 2.2, jit.py: loss fused; its LoRA "
                                       "fine-tuning recipes turn it off)"))

_MEGATRON_CORE = Framework(
    "megatron-core", attention="flash", tp_async=True, tp_overlap=False, zero=1,
    reduce_fp32=False, dropout=False, selective="attention", execution="eager", interleave=True,
    vocab_multiple=128, optimizer="adam-megatron", bf16_reduce_fp32=True, recompute_modules=("core_attn",),
    loss="megatron",
    source="NVIDIA Megatron-Core (2023-): Transformer Engine fused attention, asynchronous "
           "tensor-parallel collectives by default, gradients accumulated and reduced in fp32 "
           "in bf16 and fp8 runs (arguments.py forces it for bf16; --grad-reduce-in-bf16 is "
           "opt-in), the distributed optimizer of its "
           "pretraining examples (Megatron's optimizer passes on each shard: norm, "
           "FusedAdam, the fp32 weights copied back), no dropout in its LLM recipes; its pipelined recipes "
           "interleave (a run that does not say vp is scored with the best vp it accepts); "
           "--tp-comm-overlap is opt-in; fp8 through the Transformer Engine modules of its layer "
           "spec (gpt_layer_specs.py: TELayerNormColumnParallelLinear for qkv and fc1) under "
           "delayed scaling (--fp8-recipe delayed, the default), so those norms write fp8, with "
           "16-bit weights whose fp8 casts it caches through the step (--fp8-param-gather, fp8 "
           "weights gathered in fp8, is opt-in: DistributedDataParallelConfig.fp8_param_gather "
           "False, 0.16); "
           "biases in the GEMM epilogues (Transformer Engine 1.13 module/linear.py: the weight-"
           "gradient GEMM returns the bias gradient, cpp_extensions/gemm.py grad=True, use_bias); "
           "--recompute-method block re-runs --recompute-num-layers layers of each pipeline stage "
           "whole and none of the rest (transformer_config.py, 0.16); its selective recompute "
           "re-runs --recompute-modules, by default core_attn, the core attention whatever its "
           "kernel (attention.py checkpoint_core_attention: a fused one too); rotary embeddings "
           "through Transformer Engine's fused kernel (apply_rope_fusion; assumption: Megatron-LM's "
           "arguments.py, not in the megatron-core package, turns it on unless --no-rope-fusion, as "
           "NeMo's Llama and Mixtral configs do; TransformerConfig's own default is False); its cross "
           "entropy is Megatron's unfused vocab-parallel one on the fp32-upcast logits "
           "(--cross-entropy-loss-fusion is opt-in: ModelParallelConfig.cross_entropy_loss_fusion "
           "False, megatron-core 0.16.1 model_parallel_config.py; LanguageModule."
           "compute_language_model_loss then calls tensor_parallel.vocab_parallel_cross_entropy, "
           "whose calculate_logits_max upcasts them: loss megatron; loss=fused or te in --plan, or "
           "a row's cross_entropy column, for a run that fused it)")

FRAMEWORKS = {f.name: f for f in (
    Framework("megatron-lm", attention="standard", tp_async=False, tp_overlap=False, zero=0,
              reduce_fp32=False, dropout=True, selective="attention", execution="eager", interleave=False,
              vocab_multiple=128, sp=False, dp_overlap=False, loss="megatron", optimizer="adam-megatron",
              bf16_reduce_fp32=True, flop_convention="narayanan96", bias_kernels="separate",
              grad_accum_fusion=False, rotary_kernels="separate", softmax_kernel="megatron", precision="fp16",
              source="Megatron-LM 2021-22 (v2.x-v3.0) arguments.py defaults: hidden and attention dropout "
                     "0.1, fp16 where a run states no precision (its example scripts, "
                     "examples/pretrain_gpt*.sh, pass --fp16, as the runs of Narayanan et al. 2021 and "
                     "Korthikanti et al. 2022 trained), no distributed optimizer, the gradient all-reduce in "
                     "fp16 for fp16 runs and in "
                     "fp32 for bf16 ones (arguments.py forces --accumulate-allreduce-grads-in-fp32 for "
                     "bf16), run by training.py "
                     "after the whole forward-backward (--DDP-impl local, the default: "
                     "model.allreduce_gradients() before the optimizer step; overlapping it with the "
                     "backward pass came with Megatron-Core's --overlap-grad-reduce, 2023), fused "
                     "scale-mask-softmax (attention scores in HBM: no FlashAttention before 2023), the "
                     "vocab-parallel cross entropy on the fp32-upcast logits, one kernel per step "
                     "(mpu/cross_entropy.py), the mixed-precision optimizer's passes around apex FusedAdam "
                     "(optimizer/optimizer.py: main-gradient copy and unscale in fp16, the gradient "
                     "norm, the copy of the fp32 weights back); its local DDP keeps contiguous main "
                     "gradients (16-bit, fp32 with fp32 accumulation), zeroed each step, into which a "
                     "backward hook adds each micro-batch's gradient tensor by tensor "
                     "(param.main_grad.add_(param.grad.data), model/distributed.py; the weight-gradient "
                     "GEMMs that add into them themselves, --gradient-accumulation-fusion, came later; "
                     "assumption: with the asynchronous tensor-parallel all-reduce, as the one autograd "
                     "function that carries both in Megatron-Core 0.16 says, "
                     "linear_with_grad_accumulation_and_async_allreduce: a 2022 run says "
                     "grad_accum_fusion), no "
                     "interleaving unless "
                     "--num-layers-per-virtual-pipeline-stage; the asynchronous tensor-parallel all-reduce "
                     "was an option until 2022 (a run that used it says so); sequence parallelism is the opt-in "
                     "--sequence-parallel (from v3.0, 2022; none before); its tensor-parallel layers add "
                     "the qkv projection's bias in a kernel of their own (output + bias) and reduce each "
                     "bias gradient over the tokens in one (grad_output.sum(dim=0), or autograd's for the "
                     "biases its bias-GeLU and bias-dropout-add kernels take: megatron-core 0.2.0 "
                     "tensor_parallel/layers.py, NeMo 1.9's copy of its transformer.py); its unfused "
                     "attention is baddbmm (alpha 1/sqrt(d), whose derivative scales both gradients), "
                     "scale-mask-softmax, dropout, bmm and a permute to [s, b, h], and the split q, k, v "
                     "are concatenated in the backward; --recompute-method block (v3.0) re-runs "
                     "--recompute-num-layers layers of each pipeline stage whole and none of the rest "
                     "(assumption: the 2021 v2.x releases had it as --activations-checkpoint-method block; "
                     "their arguments.py was not at hand); a rotary model (none then: its rotary "
                     "embedding came with Megatron-Core in 2023) gets Megatron's unfused formula "
                     "(megatron-core 0.16.1 rope_utils.py _apply_rotary_pos_emb_bshd: rotate-half, two "
                     "multiplies, an add and a cat, the cos and sin tables made at each call); its "
                     "scale-mask-softmax kernel runs only on the shapes its rule allows, the others "
                     "taking PyTorch's softmax in fp32 with the layer-number scaling "
                     "(softmax_kernel megatron; --apply-query-key-layer-scaling on by default, which "
                     "sets --attention-softmax-in-fp32, as NeMo 1.11's copy of its transformer.py has "
                     "it)"),
    Framework("megatron-deepspeed", attention="standard", tp_async=False, tp_overlap=False, zero=0,
              reduce_fp32=False, dropout=True, selective="attention", execution="eager", interleave=False,
              vocab_multiple=128, sp=False, selective_recompute=False, interleaving=False, block_recompute=False,
              dp_overlap=False, loss="megatron", optimizer="adam-deepspeed", flop_convention="narayanan24k",
              bias_kernels="separate", bf16_reduce_fp32=False, bf16_zero=1, rotary_kernels="separate",
              softmax_kernel="megatron", pipe_p2p="blocking",
              source="microsoft/Megatron-DeepSpeed: the Megatron-LM 2021 model code (dropout 0.1, fused "
                     "scale-mask-softmax, the biases and unfused attention of megatron-lm) under "
                     "DeepSpeed's engine, whose zero_optimization.stage defaults to 0 and which "
                     "all-reduces the gradients after the backward pass of the last micro-batch "
                     "(engine.backward -> allreduce_gradients at the accumulation boundary; "
                     "overlap_comm is a ZeRO option); its loss is Megatron-LM's vocab-parallel cross "
                     "entropy; its mixed-precision wrappers around FusedAdam work tensor by tensor "
                     "(DeepSpeed 0.9.5: fp16's FP16_Optimizer checks each gradient for overflow with a "
                     "host synchronisation and copies each to fp32 and back, and autograd accumulates "
                     "the 16-bit gradients over micro-batches; bf16's BF16_Optimizer adds each "
                     "micro-batch's gradients into fp32 copies, takes each one's norm with a host "
                     "synchronisation, shards the fp32 weights and Adam state over data parallelism "
                     "(ZeRO-1) whatever the config says, and its pipeline engine all-reduces the whole "
                     "fp32 gradients, not a reduce-scatter, then all-gathers the updated bf16 weights: "
                     "pipe/engine.py _bf16_reduce_grads, bf16_optimizer.py update_lp_params); the engine "
                     "reduces in its communication_data_type, by default the run's 16-bit type (engine.py: "
                     "BF16_Optimizer's fp32 gradients cast to bf16 for the all-reduce and back; "
                     "reduce_fp32 off), flattening each bucket of gradients, scaling it by 1/dp after the "
                     "all-reduce and copying fp16's back tensor by tensor (allreduce_and_copy; assumption: "
                     "Megatron-DeepSpeed's GPT runs under the pipeline engine, its default GPTModelPipe, "
                     "at pp 1 too); DeepSpeed's pipeline engine has no interleaved "
                     "schedule; its activation checkpointing re-runs whole layers, every "
                     "activation_checkpoint_interval layers of the PipelineModule (no selective "
                     "recompute, no count of layers left without it) and it has no Megatron sequence "
                     "parallelism; assumption: a rotary model runs Megatron's unfused formula (its "
                     "rotary_pos_embedding.py, not at hand, taken as megatron-core's "
                     "_apply_rotary_pos_emb_bshd); its softmax is megatron-lm's (softmax_kernel megatron); its "
                     "pipeline engine sends each activation and gradient with a blocking p2p.send, its "
                     "metadata first, and receives with a blocking p2p.recv, one after another "
                     "(pipe/engine.py, p2p.py; the activations split over the tensor-parallel ranks and "
                     "gathered on arrival, PartitionedTensor), so a stage between two others waits "
                     "through four transfers a micro-batch (pipe_p2p blocking; its TrainSchedule's "
                     "instruction order, schedule.py); Megatron-DeepSpeed's GPT keeps the attention "
                     "mask in args (pretrain_gpt.py), not sent between stages; its throughput log counts "
                     "24·k·B·s·l·h²(1 + s/6h + V/16lh) FLOPs a step, k = 4 with activation recompute and 3 "
                     "without, the vocabulary term unchanged (megatron/utils.py throughput_calculator; "
                     "assumption: as remembered, not at hand: flop_convention narayanan24k)"),
    Framework("nemo-megatron", attention="standard", tp_async=True, tp_overlap=False, zero=0,
              reduce_fp32=True, dropout=True, selective="attention", execution="eager", interleave=False,
              vocab_multiple=128, sp=False, dp_overlap_flat=True, loss="megatron", optimizer="adam-megatron",
              interleaving=False, bias_kernels="separate", grad_accum_fusion=False, rotary_kernels="separate",
              softmax_kernel="megatron",
              source="NVIDIA NeMo-Megatron (NeMo 1.x, 2022; the NeMo-Megatron launcher's GPT-3 recipes), "
                     "read from nemo_toolkit 1.11.0 (August 2022): NeMo's own Megatron-style transformer "
                     "(modules/common/megatron/transformer.py; Transformer Engine and FlashAttention came "
                     "later): CoreAttention is baddbmm, apex's fused scale-mask-softmax, dropout, bmm and a "
                     "permute (the unfused attention of megatron-lm), hidden and attention dropout 0.1, "
                     "the qkv bias added after its GEMM and each bias gradient reduced apart (apex's "
                     "tensor-parallel linears, Megatron's), the asynchronous tensor-parallel all-reduce "
                     "(no_async_tensor_model_parallel_allreduce only without tp or with sequence "
                     "parallelism; assumption: apex's sequence-parallel backward overlaps its all-gather "
                     "and reduce-scatter as Megatron-LM 2022's), sequence_parallel off unless set, "
                     "make_vocab_size_divisible_by 128, apex's vocab-parallel cross entropy, no "
                     "interleaved pipeline, activations_checkpoint_method block; assumption: bf16 with "
                     "megatron_amp_O2 (the launcher's recipes): MainParamsOptimizerWrapper's fp32 main "
                     "gradients, the gradient norm, Adam and the copy back (Megatron's passes), each "
                     "micro-batch's gradients added into the fp32 main gradients tensor by tensor "
                     "(optimizer_with_main_params.py _make_param_hook: gradient_accumulation_fusion "
                     "defaults to False and is forced off without O2 or pipeline parallelism: "
                     "megatron_base_model.py), the fp32 "
                     "gradients all-reduced under the backward only without pipeline and sequence "
                     "parallelism (megatron_gpt_model.py training_step: after the backward otherwise); "
                     "fp16 cannot run O2 there and autocasts fp32 weights, whose gradients are fp32 too "
                     "(assumption: its optimizer step costed as bf16's); assumption: a rotary model "
                     "(position_embedding_type rope) runs the unfused rotate-half formula in 16 bits, as "
                     "megatron-core's _apply_rotary_pos_emb_bshd; its CoreAttention scales the queries "
                     "and keys by the layer number with the softmax in fp32 "
                     "(apply_query_key_layer_scaling True by default, transformer.py, megatron_gpt_model.py) "
                     "through apex's FusedScaleMaskSoftmax: the kernel on the shapes its rule allows, "
                     "PyTorch's chain on the others (softmax_kernel megatron)"),
    _MEGATRON_CORE,
    _NEMO_2024,
    replace(_NEMO_2024, name="nemo", bf16_reduce_fp32=False, loss="te",
            source="NVIDIA NeMo 2 LLM performance recipes of 2025 on (containers 25.xx, nemo_toolkit 2.2 to "
                   "2.6): " + _NEMO_SOURCE.format(
                       reduce="gradients reduced in bf16 (the pretraining performance_optimizations of "
                              "nemo_toolkit 2.2.0 to 2.6.2 set grad_reduce_in_fp32 False, and from 2.4 the "
                              "performance scripts' set_precision_configs do so for every dtype)",
                       loss="Transformer Engine's cross entropy (GPTConfig cross_entropy_loss_fusion True; "
                            "the performance scripts' set_perf_optimization_configs set "
                            "cross_entropy_fusion_impl te, nemo_toolkit 2.4.0 to 2.6.2, and 2.3.0's "
                            "DeepSeek-V3 and Llama 4 scripts: TE's Triton parallel_cross_entropy, loss te; "
                            "assumption: a 2025 run is of those versions, 2.2 and 2.3's other scripts "
                            "running the native fused one, loss fused)")),
    replace(_MEGATRON_CORE, name="megatron-bridge", loss="te", fp8_params=True, shared_overlap=True,
            source="NVIDIA NeMo Megatron-Bridge (2025-; megatron_bridge 0.3.1 on PyPI, read from its recipes "
                   "and model providers): Megatron-Core as the megatron-core preset runs it, with the defaults "
                   "its recipes share: the distributed optimizer with the gradients reduced in fp32 "
                   "(training/mixed_precision.py bf16_mixed, grad_reduce_in_fp32 True, and each pretraining "
                   "recipe's DistributedDataParallelConfig), no dropout, no CUDA graphs (cuda_graph_impl none); "
                   "Transformer Engine's cross entropy (cross_entropy_loss_fusion True with "
                   "cross_entropy_fusion_impl te in its Llama 3, Qwen3, Qwen3-MoE, DeepSeek, Kimi and Moonlight "
                   "recipes and its Llama providers; the other recipes keep Megatron-Core's native fused kernel: "
                   "loss fused in --plan or a row's cross_entropy column); an fp8 run's weights held and "
                   "gathered in fp8 (its fp8 mixed-precision recipes, delayed, current-scaling and mxfp8, set "
                   "fp8_param_gather True, which sets fp8_param with it; the blockwise subchannel ones do not: "
                   "fp8_params off); a mixture of experts' shared experts beside its token all-to-alls "
                   "(moe_shared_expert_overlap True in its DeepSeek, GLM-4.5, Kimi, Llama 4 and Nemotron-H "
                   "providers; where the plan allows it) and dropless experts (no recipe sets a capacity "
                   "factor); tensor-parallel overlap off unless a recipe's CommOverlapConfig turns it on (its "
                   "Llama 3 70B and 405B, GPT-3 175B and Nemotron-H recipes do: tp_overlap in --plan, a row's "
                   "tp_comm_overlap column), and pipeline sends batched unless that config is given (with it "
                   "and vp > 1 they overlap: pipe_p2p overlapped); rotary embeddings through Transformer "
                   "Engine's fused kernel (apply_rope_fusion True in its Llama, Nemotron and Mamba providers; "
                   "its DeepSeek, Kimi and Qwen providers keep TransformerConfig's False: rotary_kernels "
                   "separate); its MoE recipes run the router unfused (moe_router_fusion False), which phaze "
                   "costs as the router's GEMM and one top-k softmax kernel each way (docs/design.md)"),
    Framework("torchtitan", attention="flash2", tp_async=False, tp_overlap=False, zero=3,
              reduce_fp32=True, dropout=False, selective="op", execution="eager", interleave=False,
              block_recompute=False, interleave_vp=2,
              fp8_casts="separate", bias_kernels="separate", cp_comm="torch", fsdp_pp="step",
              rotary_kernels="complex", kv_repeat="copied",
              source="pytorch/torchtitan defaults: FSDP2 (ZeRO-3) with param bf16 and reduce fp32, "
                     "SDPA (FlashAttention-2 backend), selective activation checkpointing per op (its "
                     "activation checkpointing is full, selective per op or a compiler memory budget: "
                     "torchtitan 0.3 distributed/activation_checkpoint.py; no count of whole layers; the layer-wise "
                     "option of earlier releases, every N-th layer whole, is not modelled), async "
                     "TP opt-in, pipeline schedule 1F1B (its looped schedules, Interleaved1F1B and the "
                     "others, run 2 virtual stages a rank unless pipeline_parallel_layers_per_stage says "
                     "otherwise: torchtitan 0.3 distributed/pipeline_parallel.py); float8 through "
                     "torchao's Float8Linear with dynamic (tensorwise) scaling: each linear casts its input "
                     "and output gradient; "
                     "PyTorch's autograd reduces a bias gradient in a kernel of its own (its Llama models "
                     "have no biases; assumption: a biased model's qkv bias added apart, as in Megatron); "
                     "its context parallelism is PyTorch's (cp_comm=torch): the default rotater (torch "
                     "2.6 and 2.13 _cp_options.rotate_method ALL_GATHER; torchtitan 0.3 leaves it) "
                     "all-gathers each layer's K and V under the first step's attention, in the forward "
                     "and again in the backward, which passes the fp32 dK and dV round the ring "
                     "(convert_to_f32); under pipeline parallelism its FSDP keeps each stage's weights whole "
                     "through the step (torchtitan 0.3 distributed/fsdp.py: reshard_after_forward off when "
                     "PP is on, 'to avoid per-microbatch all-gathers') and PyTorch's schedules defer the "
                     "gradient reduce-scatter to the stage's last backward, accumulating fp32 gradients whole "
                     "in between (torch 2.7 pipelining/stage.py backward_maybe_with_nosync; fsdp_pp=step); "
                     "its rotary embedding multiplies the queries and keys as fp32 complex numbers "
                     "(apply_rotary_emb: x.float() as complex, times freqs_cis, type_as(x); torchtitan 0.1.0 "
                     "to 0.3.0) and its attention reads key/value heads copied to one per query head "
                     "(repeat_kv, expand then reshape: torchtitan 0.1.0 and 0.2.0 models/llama3/model/model.py, "
                     "and the code of its 2024 benchmarks; 0.3.0 passes enable_gqa to SDPA instead, so a "
                     "run of it says kv_repeat grouped); eager: its torch.compile option, which fuses the "
                     "element-wise kernels, is not modelled"),
    Framework("maxtext", attention="flash", tp_async=True, tp_overlap=True, zero=3,
              reduce_fp32=False, dropout=False, selective="attention", execution="xla", interleave=False,
              block_recompute=False, recompute_modules=("core_attn",),
              flop_convention="6n_12lqs", dp_shard=DP_SHARD_NODE, cp_comm="all_gather",
              source="AI-Hypercomputer/maxtext base.yml: FSDP sharding (ZeRO-3) over a slice's chips and data "
                     "parallelism across slices (maxtext 0.2.5 configs/base.yml: ici_fsdp_parallelism -1, "
                     "dcn_data_parallelism -1, dcn_fsdp_parallelism 1: the weights and optimizer state are "
                     "sharded within a slice, replicated across slices, whose gradients are all-reduced over "
                     "the data-centre network; dp_shard=node), dropout 0, splash/flash "
                     "attention kernels, one remat_policy for every layer of its scanned stack (no count of layers "
                     "left without it); its selective policy, remat_policy minimal, saves the projections' "
                     "outputs and not the attention's (maxtext 0.2.5 layers/nnx_decoders.py minimal_policy: "
                     "query_proj, key_proj, value_proj, out_proj, mlpwi_0, mlpwi_1, mlpwo; no 'context'), "
                     "so the flash kernel re-runs in the backward (core_attn); assumption: its FSDP "
                     "collectives move the bf16 compute copies of "
                     "the float32 weights (weight_dtype float32; the dtype on the wire is not published); "
                     "XLA schedules "
                     "collectives asynchronously beside compute (its latency-hiding scheduler); one "
                     "compiled program (its full remat, jax.checkpoint with nothing saved, re-runs only what "
                     "the backward reads); assumption: XLA fuses an fp8 run's casts into the ops that "
                     "produce their inputs (its delayed-scaling fp8 ops; no published profile); its context "
                     "parallelism gathers K and V (cp_comm=all_gather: maxtext 0.2.5 base.yml "
                     "context_parallel_strategy all_gather, the default; layers/attention_op.py replicates K "
                     "and V over the context axis at the attention's shard_map, Q stays sharded, on TPU's "
                     "splash kernel and GPU's Transformer Engine alike); assumption: XLA fuses a rotary "
                     "embedding's element-wise ops into one pass over each of the queries and keys"),
    Framework("llm-foundry", attention="flash2", tp_async=False, tp_overlap=False, zero=3,
              reduce_fp32=True, dropout=False, selective="attention", execution="eager", interleave=False,
              flop_convention="6n_12lqs",
              fp8_casts="te-linear", bias_kernels="separate",
              source="mosaicml/llm-foundry MPT yamls: FSDP FULL_SHARD (ZeRO-3), mixed_precision DEFAULT "
                     "(fp32 reduction), attn_impl flash (FlashAttention-2), no dropout; fp8 through "
                     "Transformer Engine's te.Linear (fc_type te; llm-foundry 0.22 models/layers/fc.py registers "
                     "te.Linear), which casts its input and keeps the fp8 copy for the backward "
                     "(fp8_casts te-linear); assumption: the norms stay separate "
                     "(its LayerNorm-fused te_ln_mlp FFN is opt-in), so each linear casts its input; "
                     "biases as torchtitan's (its MPT models set no_bias); activation_checkpointing_target can "
                     "checkpoint only some blocks (first-n, range-i-j: llm-foundry 0.22 models/utils/act_ckpt.py); "
                     "assumption: a rotary model runs flash-attn's rotary kernel (rope_impl dail, its default "
                     "as remembered, not checked), one pass per tensor"),
)}

# Spellings of each framework in a free ``framework`` column, tried in this order (a NeMo run
# names Megatron-Core too, so NeMo is matched first). EleutherAI's GPT-NeoX library is
# Megatron-LM's model code under DeepSpeed's engine (Black et al. 2022, "GPT-NeoX-20B", Sec. 3:
# built on Megatron and DeepSpeed; assumption: the preset's DeepSpeed 0.9.5 settings for its own
# fork of DeepSpeed), so it takes ``megatron-deepspeed``. Megatron-Bridge (full name "NeMo
# Megatron-Bridge", "a refactor of the previous NeMo training stack": megatron_bridge 0.3.1's
# package metadata) has its own preset, matched first: never the 2021 Megatron-LM that "Megatron"
# alone names, nor the 2022 NeMo-Megatron that "NeMo Megatron-Bridge" spells. Megatron-LM's release branches named
# core_r0.N (from 2023) are Megatron-Core's, dated or not.
_ALIASES = (
    ("megatron-bridge", ("megatron-bridge", "megatron bridge", "megatron_bridge")),
    ("torchtitan", ("torchtitan",)),
    ("maxtext", ("maxtext",)),
    ("llm-foundry", ("llm-foundry", "llmfoundry", "foundry", "composer", "mosaicml")),
    ("nemo-megatron", ("nemo-megatron", "nemo megatron", "nemo_megatron")),
    ("nemo", ("nemo",)),
    ("megatron-deepspeed", ("megatron-deepspeed", "megatron deepspeed", "deepspeed", "gpt-neox", "gpt neox",
                            "gptneox")),
    ("megatron-core", ("megatron-core", "megatron core", "mcore", "core_r")),
    ("megatron-lm", ("megatron-lm", "megatron lm", "megatron")),
)


def resolve_framework(text: str) -> Framework | None:
    """The preset a ``framework`` value names, or None when it names none of them. Canonical
    names and their usual spellings are matched (case-insensitive); Megatron-LM from 2023 on is
    built on Megatron-Core, so ``Megatron-LM`` with a year of 2023 or later is ``megatron-core``;
    NeMo of 2022 or before is NeMo-Megatron (``nemo-megatron``), of 2023 or 2024 (a year, a
    container version such as 24.07, or nemo_toolkit 2.0 or 2.1) ``nemo-2024``, later or undated
    ``nemo``."""
    t = text.strip().lower()
    if not t:
        return None
    if t in FRAMEWORKS:
        return FRAMEWORKS[t]
    for name, spellings in _ALIASES:
        if any(s in t for s in spellings):
            years = [int(y) for y in re.findall(r"\b(20\d\d)\b", t)]
            if name == "megatron-lm" and years and max(years) >= 2023:
                name = "megatron-core"
            if name == "nemo":
                # NeMo's container versions (YY.MM) and nemo_toolkit 2.0 / 2.1 date a NeMo run too
                years += [2000 + int(y) for y, m in re.findall(r"\b(2\d)\.(\d\d)\b", t) if 1 <= int(m) <= 12]
                years += [2024 for _ in re.findall(r"nemo[\s_-]*(?:toolkit)?[\s=v-]*2\.[01](?![\d])", t)]
                if years and max(years) <= 2022:
                    name = "nemo-megatron"
                elif years and max(years) <= 2024:
                    name = "nemo-2024"
            return FRAMEWORKS[name]
    return None


def framework(name: str, source: str = "--framework", field: str | None = None) -> Framework:
    """The preset named ``name`` (a canonical name or a spelling), or a ConfigError naming
    ``source`` (and ``field``, in a file)."""
    f = resolve_framework(name)
    if f is None:
        raise ConfigError(source, field, f"unknown framework {name!r}{suggest(name, FRAMEWORKS)}; "
                          f"allowed: {', '.join(FRAMEWORKS)}")
    return f


def padded_vocab(vocab: int, multiple: int) -> int:
    """``vocab`` rounded up to a multiple of ``multiple`` (Megatron pads its embedding so)."""
    return -(-vocab // multiple) * multiple


PLAN_KEYS = ("attention", "tp_async", "tp_overlap", "zero", "reduce_fp32", "dp_overlap", "loss", "optimizer",
             "grad_accum_fusion", "dp_shard", "cp_comm", "fsdp_pp", "fp8_params", "pipe_p2p", "shared_overlap")


def plan_settings(fw: Framework | None, precision: str = "bf16") -> dict:
    """The plan keys a preset sets (:data:`PLAN_KEYS`), for a run at ``precision``; without a
    framework, :class:`phaze.plan.Plan`'s own defaults."""
    if fw is None:
        return {k: getattr(Plan(), k) for k in PLAN_KEYS}
    return dict({k: getattr(fw, k) for k in PLAN_KEYS}, reduce_fp32=fw.reduces_fp32(precision),
                zero=fw.zero_for(precision), fp8_params=fw.fp8_params and precision == "fp8")


def model_with(fw: Framework, model: Model) -> tuple[Model, dict]:
    """``model`` with the preset's fp8 casts (an fp8 model), bias kernels (a model with biases),
    rotary kernels (a rotary model), key/value copies (grouped-query attention), unfused softmax
    (Megatron's kernel rule) and expert capacity (a mixture of experts) where the model does not
    say them, and what was set."""
    changes = {}
    if model.precision == "fp8" and not model.fp8_casts:
        changes["fp8_casts"] = fw.fp8_casts
    if model.biased_linears and not model.bias_kernels:
        changes["bias_kernels"] = fw.bias_kernels
    if model.rotated_width and not model.rotary_kernels:
        changes["rotary_kernels"] = fw.rotary_kernels
    if model.kv_heads < model.heads and not model.kv_repeat:
        changes["kv_repeat"] = fw.kv_repeat
    if fw.softmax_kernel != "fused" and not model.softmax_kernel:
        changes["softmax_kernel"] = fw.softmax_kernel
    if model.moe and fw.moe_capacity and not model.capacity_factor:
        changes["capacity_factor"] = fw.moe_capacity
    return (replace(model, **changes) if changes else model), changes


def plan_with(fw: Framework, plan: Plan, given=frozenset(), precision: str = "bf16",
              model: Model | None = None) -> tuple[Plan, dict]:
    """``plan`` with the preset's settings for every key not in ``given`` (the ones the user set),
    and what was set, for a run at ``precision`` of ``model``. ``recompute=selective`` becomes the
    framework's selective policy; a preset's shared-expert overlap is set only for a ``model``
    with shared experts and only where the plan allows it (:func:`phaze.plan.shared_overlap_conflict`;
    without ``model``, not at all)."""
    changes = {k: x for k, x in plan_settings(fw, precision).items() if k not in given}
    if fw.sp is not None and "sp" not in given:
        changes["sp"] = fw.sp and plan.tp > 1
    if "dp_overlap" not in given:
        changes["dp_overlap"] = hides_dp_reduction(fw.dp_overlap, fw.dp_overlap_flat, plan.pp,
                                                   changes.get("sp", plan.sp))
    if plan.recompute == "selective" and fw.selective == "op":
        changes["recompute"] = "op"
    if (fw.recompute_modules and "recompute_modules" not in given and "selective" in plan.stage_modes()[0]
            and not (model is not None and model.hybrid)):
        changes["recompute_modules"] = fw.recompute_modules
    out = replace(plan, **changes)
    if out.shared_overlap and "shared_overlap" not in given and (
            model is None or shared_overlap_conflict(out, model.shared_experts)):
        out = replace(out, shared_overlap=False)
        changes["shared_overlap"] = False
    said = {k: x for k, x in changes.items()   # only where it acts
            if (k != "fsdp_pp" or out.fsdp_once) and (k != "fp8_params" or precision == "fp8")
            and (k != "shared_overlap" or out.shared_overlap)}
    return out, dict(said, execution=fw.execution)


def options_with(fw: Framework, options: PlacementOptions, given=frozenset(),
                 precision: str = "bf16", model: Model | None = None) -> tuple[PlacementOptions, dict]:
    """The placement space with the preset's settings for every option not in ``given``, and
    what was set, for a run at ``precision`` (of ``model``: a shared-expert overlap is said only
    for a model with shared experts; the search sets it only in the plans that allow it). A
    framework that shards with FSDP (zero 3) searches only that stage; the others keep the searched
    stages. ``selective`` recompute becomes the framework's policy (but Megatron-Core's modules for a
    hybrid ``model``, where they are not modelled: its selective recompute is Megatron-LM's)."""
    # the plan keys a preset sets, as in a plan (the searched ZeRO stages below)
    changes: dict = {k: x for k, x in plan_settings(fw, precision).items()
                     if k != "zero" and k not in given and (k != "fp8_params" or precision == "fp8")
                     and (k != "shared_overlap" or (x and (model is None or model.shared_experts)))}
    changes["execution"] = fw.execution
    if fw.dp_overlap_flat and "dp_overlap" not in given:
        changes["dp_overlap_flat"] = True
    if "zero" not in given and (fw.zero == 3 or fw.zero_for(precision) != fw.zero):
        changes["zero"] = (fw.zero_for(precision),)
    if "sp" not in given and fw.sp is not None:
        changes["sp"] = fw.sp
    if "vp" not in given and not fw.interleaving:
        changes["vp"] = (1,)
    dropped = {r for r, offered in (("selective", fw.selective_recompute), ("block", fw.block_recompute))
               if not offered}
    if "recompute" not in given and dropped & set(options.recompute):
        changes["recompute"] = tuple(r for r in options.recompute if r not in dropped)
    recompute = changes.get("recompute", options.recompute)
    if fw.selective == "op" and "selective" in recompute:
        changes["recompute"] = tuple("op" if r == "selective" else r for r in recompute)
    if (fw.recompute_modules and "recompute_modules" not in given and "selective" in recompute
            and not (model is not None and model.hybrid)):
        changes["recompute_modules"] = fw.recompute_modules
    return replace(options, **changes), changes


def describe(fw: Framework, changes: dict) -> str:
    """One line: the preset, what it set and what it stands for (its source's title; the
    whole source is ``fw.source``, which a JSON printout carries beside it)."""
    def fmt(k, v):
        if k == "dp_shard":
            return dp_shard_text(v)
        return "on" if v is True else "off" if v is False else ",".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return f"{fw.name}: " + ", ".join(f"{k}={fmt(k, v)}" for k, v in changes.items()) + f" ({fw.title})"
