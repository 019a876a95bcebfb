"""A training run's memory per process, from the config alone (no model is built, no torch imported): parameters,
gradients, optimizer state, what data parallelism adds (DDP's gradient buckets; FSDP2's gathered blocks),
activations kept for the backward per image (with and without activation checkpointing) and the checkpoint each
process writes. A plan to size a job before it starts; BENCHMARKS.md ("Memory plan") compares it with measured runs.

Activations count the tensors autograd keeps in a plain ViT's training forward with the fused attention kernel
(`tests/models/test_memory.py` holds the count to the bytes torch's saved-tensor hooks see). Per block and
image, with T tokens, width D, MLP width M and h heads, in float32: T·(8D + 2M) values (the inputs of both
LayerNorms and of the qkv Linear, q/k/v, the attention output, the MLP hidden layer before and after the GELU);
under bf16 autocast the two LayerNorm inputs (the residual stream) stay float32 and the rest is bfloat16. Both
add T·(4 + h) float32 statistics (the LayerNorms' mean and 1/std, attention's log-sum-exp). Outside the blocks:
the image (the patch convolution's input) and the final norm's input and output (bf16: its class token only).
With checkpointing a block keeps its input only, and the backward recomputes one block at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vitlab.models.config import ModelConfig, ViTConfig
from vitlab.models.flops import count_parameters

# Bytes per parameter of the optimizer state (float32): AdamW's two moments, SGD's momentum buffer.
OPTIMIZER_STATE = {"adam": 8, "sgd": 4, "sgd-nomomentum": 0}
# Bytes of an activation value in the compute precision; bf16 autocast keeps float32 weights and states.
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2}
STRATEGIES = ("ddp", "fsdp")
PRECISIONS = tuple(ACTIVATION_BYTES)
_F32 = 4


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per process of one training job (DDP: every process holds the whole model; FSDP2: its 1/world
    share, plus the blocks it gathers while computing them)."""

    parameters: int
    gradients: int
    optimizer: int  # optimizer state
    ema: int  # the EMA's copy of the weights (--ema)
    parallel: int  # DDP: gradient buckets (a copy of the gradients); FSDP2: gathered weights and gradients in flight
    autocast: int  # bf16 autocast's copies of the weights, cached for the step
    activations_per_image: int
    activations_per_image_checkpointed: int
    checkpoint: int  # bytes this process writes per checkpoint (DDP: rank 0 writes all, the others nothing)
    save_extra: int  # bytes a save adds on rank 0 (a gathered state); 0 when each process writes its own shards

    @property
    def states(self) -> int:
        """Everything but the activations: what the job holds between steps."""
        return self.parameters + self.gradients + self.optimizer + self.ema + self.parallel + self.autocast

    def total(self, batch_per_process: int, checkpointed: bool = False) -> int:
        per_image = self.activations_per_image_checkpointed if checkpointed else self.activations_per_image
        return self.states + batch_per_process * per_image

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "states": self.states}


def activation_bytes(config: ViTConfig, precision: str = "fp32", checkpointed: bool = False) -> int:
    """Bytes autograd keeps per image for the backward of a plain ViT (module doc); with checkpointing, the
    block inputs plus one block recomputed in the backward."""
    if not isinstance(config, ViTConfig) or config.resnet is not None:
        raise ValueError(f"activations are counted for plain ViTs, not {config.name or type(config).__name__}")
    b = ACTIVATION_BYTES[precision]
    gh, gw = config.grid_size()
    t, d = config.num_prefix_tokens + gh * gw, config.width
    block = t * (2 * d * _F32 + (6 * d + 2 * config.mlp_dim) * b) + t * (4 + config.num_heads) * _F32
    image = config.in_chans * config.image_size[0] * config.image_size[1] * b
    head = t * d * _F32 if b == _F32 else d * b  # the final norm's output, or the class token cast for the head
    outside = image + t * d * _F32 + head + 2 * t * _F32  # and the final norm's input and statistics
    if checkpointed:
        return config.depth * t * d * _F32 + block + outside
    return config.depth * block + outside


def memory_plan(config: ModelConfig, world: int = 1, strategy: str = "ddp", precision: str = "fp32",
                optimizer: str = "adam", ema: bool = False, async_save: bool = False) -> MemoryPlan:
    """The memory of training `config` on `world` processes (module doc). `optimizer`: a key of OPTIMIZER_STATE.
    `save_extra` is host memory: rank 0's gathered copy of a whole checkpoint (DDP, one process), or each
    process's staged copy of its shards while an asynchronous save writes them (FSDP2, `async_save`)."""
    if strategy not in STRATEGIES or precision not in PRECISIONS or optimizer not in OPTIMIZER_STATE or world < 1:
        raise ValueError(f"strategy one of {STRATEGIES}, precision one of {PRECISIONS}, optimizer one of "
                         f"{tuple(OPTIMIZER_STATE)} and world >= 1, not {strategy!r}, {precision!r}, {optimizer!r}, "
                         f"{world}")
    p = count_parameters(config)
    share = world if strategy == "fsdp" and world > 1 else 1
    weights, state = _F32 * p, OPTIMIZER_STATE[optimizer] * p
    block = _block_parameters(config) if isinstance(config, ViTConfig) else 0
    if share > 1:  # a block gathered, the next prefetched, one block's gradients reduce-scattered; the root
        parallel = 3 * _F32 * block + _F32 * (p - config.depth * block)  # (embedding, norm, head) stays gathered
    else:
        parallel = weights if world > 1 else 0  # DDP's gradient buckets
    kept = weights + state + (weights if ema else 0)
    return MemoryPlan(
        parameters=weights // share, gradients=weights // share, optimizer=state // share,
        ema=(weights if ema else 0) // share, parallel=parallel,
        autocast=2 * p if precision == "bf16" else 0,  # the casts of every weight, kept until the backward
        activations_per_image=activation_bytes(config, precision),
        activations_per_image_checkpointed=activation_bytes(config, precision, checkpointed=True),
        checkpoint=kept // share, save_extra=(kept // share if async_save else 0) if share > 1 else kept,
    )


def _block_parameters(config: ViTConfig) -> int:
    d, m = config.width, config.mlp_dim
    return 4 * d + 3 * d * d + (3 * d if config.qkv_bias else 0) + d * d + d + 2 * d * m + m + d
