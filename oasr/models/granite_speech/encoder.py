"""Granite Speech's conformer encoder and Q-Former projector, module for module in the checkpoint's key layout
(``encoder.layers.0.attn.to_q``, ``projector.qformer.encoder.layer.0.crossattention.attention.query`` ...).

Each conformer block is half a feed-forward, block-local self-attention with Shaw's relative position embeddings
(the frames cut into blocks of ``context_size`` from the start; a query sees only its own block), a convolution
module (pointwise up, GLU, depthwise, batch norm, SiLU, pointwise down), the other half feed-forward, and a final
LayerNorm. After the middle block a CTC head's softmax is projected back into the stream.

transformers runs one input at a time; a batch here gives each row exactly its own result by keeping the frames
past a row's length out of everything that mixes frames: they are masked as attention keys and zeroed before the
depthwise convolution and before the projector (where a lone input's last window is zero-padded).

The projector cuts the encoder output into windows of ``window_size`` frames; a Q-Former (BLIP-2's, post-LN BERT
layers) runs ``num_queries`` learned queries over each window, cross-attending to its frames, and a linear layer
maps each query to the language model's width: ``num_queries`` audio positions per window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import GLU, BatchNorm1d, Conv1d, Embedding, LayerNorm, Linear, PointwiseConv1d, SiLU, activation, sdpa
from oasr.models.granite_speech.config import GraniteEncoderConfig, GraniteSpeechConfig, QFormerConfig


class FeedForward(nn.Module):
    def __init__(self, config: GraniteEncoderConfig) -> None:
        super().__init__()
        self.pre_norm = LayerNorm(config.hidden_dim)
        self.up_proj = Linear(config.hidden_dim, config.hidden_dim * config.feedforward_mult)
        self.silu = SiLU()
        self.down_proj = Linear(config.hidden_dim * config.feedforward_mult, config.hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.silu(self.up_proj(self.pre_norm(x))))


class BlockAttention(nn.Module):
    def __init__(self, config: GraniteEncoderConfig) -> None:
        super().__init__()
        inner = config.dim_head * config.num_heads
        self.context = config.context_size
        self.num_heads = config.num_heads
        self.scale = config.dim_head**-0.5
        self.pre_norm = LayerNorm(config.hidden_dim)
        self.to_q = Linear(config.hidden_dim, inner, bias=False)
        self.to_kv = Linear(config.hidden_dim, 2 * inner, bias=False)
        self.to_out = Linear(inner, config.hidden_dim)
        self.rel_pos_emb = Embedding(2 * config.max_pos_emb + 1, config.dim_head)

    def forward(self, x: torch.Tensor, distances: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """x: [B, T, d]; distances: [C, C] indices into ``rel_pos_emb``; valid: bool [B, T] -> [B, T, d]."""
        b, t, _ = x.shape
        blocks = -(-t // self.context)
        pad = blocks * self.context - t
        h = F.pad(self.pre_norm(x), (0, 0, 0, pad))
        keys = F.pad(valid, (0, pad)).view(b * blocks, 1, 1, self.context)

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(b * blocks, self.context, self.num_heads, -1).transpose(1, 2)

        q = heads(self.to_q(h))
        k, v = (heads(y) for y in self.to_kv(h).chunk(2, dim=-1))
        bias = torch.einsum("bhcd,crd->bhcr", q, self.rel_pos_emb(distances)) * self.scale
        bias = bias.masked_fill(~keys, -torch.finfo(bias.dtype).max)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)
        out = out.transpose(1, 2).reshape(b, blocks * self.context, -1)[:, :t]
        return self.to_out(out)


class DepthwiseConv(nn.Module):
    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        pad = kernel_size // 2
        self.padding = (pad, pad - (kernel_size + 1) % 2)
        self.conv = Conv1d(channels, channels, kernel_size, groups=channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, self.padding))


class ConvModule(nn.Module):
    def __init__(self, config: GraniteEncoderConfig) -> None:
        super().__init__()
        inner = config.hidden_dim * config.conv_expansion_factor
        self.norm = LayerNorm(config.hidden_dim)
        self.up_conv = PointwiseConv1d(config.hidden_dim, 2 * inner)
        self.glu = GLU(dim=-1)
        self.depth_conv = DepthwiseConv(inner, config.conv_kernel_size)
        self.silu = SiLU()
        self.batch_norm = BatchNorm1d(inner)
        self.down_conv = PointwiseConv1d(inner, config.hidden_dim)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """x: [B, T, d]; valid: bool [B, T] -> [B, T, d]. The pointwise convolutions run channel-last."""
        h = self.glu(self.up_conv(self.norm(x))) * valid[..., None].to(x.dtype)
        h = self.silu(self.batch_norm(self.depth_conv(h.transpose(1, 2))))
        return self.down_conv(h.transpose(1, 2))


class ConformerBlock(nn.Module):
    def __init__(self, config: GraniteEncoderConfig) -> None:
        super().__init__()
        self.ff1 = FeedForward(config)
        self.attn = BlockAttention(config)
        self.conv = ConvModule(config)
        self.ff2 = FeedForward(config)
        self.post_norm = LayerNorm(config.hidden_dim)

    def forward(self, x: torch.Tensor, distances: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn(x, distances, valid)
        x = x + self.conv(x, valid)
        x = x + 0.5 * self.ff2(x)
        return self.post_norm(x)


class ConformerEncoder(nn.Module):
    def __init__(self, config: GraniteEncoderConfig) -> None:
        super().__init__()
        self.config = config
        steps = torch.arange(config.context_size)
        distances = (steps[:, None] - steps[None, :]).clamp(-config.context_size, config.context_size)
        # Not a checkpoint key (derived from the config, as transformers' non-persistent buffer).
        self.register_buffer("attention_dists", distances + config.max_pos_emb, persistent=False)
        self.input_linear = Linear(config.input_dim, config.hidden_dim)
        self.layers = nn.ModuleList(ConformerBlock(config) for _ in range(config.num_layers))
        self.out = Linear(config.hidden_dim, config.output_dim)
        self.out_mid = Linear(config.output_dim, config.hidden_dim)

    def forward(self, features: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """features: [B, T, input_dim]; valid: bool [B, T] -> [B, T, hidden_dim]."""
        x = self.input_linear(features)
        middle = len(self.layers) // 2
        for index, layer in enumerate(self.layers, start=1):
            x = layer(x, self.attention_dists, valid)
            if index == middle:
                x = x + self.out_mid(torch.softmax(self.out(x), dim=-1))
        return x


class QFormerProjections(nn.Module):
    def __init__(self, config: QFormerConfig, kv_width: int) -> None:
        super().__init__()
        self.query = Linear(config.hidden_size, config.hidden_size)
        self.key = Linear(kv_width, config.hidden_size)
        self.value = Linear(kv_width, config.hidden_size)


class QFormerResidual(nn.Module):
    """``dense`` then ``LayerNorm`` over the sum with the block's input (BERT's post-LN)."""

    def __init__(self, config: QFormerConfig, width: int) -> None:
        super().__init__()
        self.dense = Linear(width, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class QFormerAttention(nn.Module):
    """BLIP-2's attention block: ``attention.{query,key,value}`` then ``output.{dense,LayerNorm}`` (post-LN)."""

    def __init__(self, config: QFormerConfig, kv_width: int) -> None:
        super().__init__()
        self.attention = QFormerProjections(config, kv_width)
        self.output = QFormerResidual(config, config.hidden_size)
        self.num_heads = config.num_attention_heads

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """x: [N, Q, h] queries; context: [N, S, kv_width] what they attend to -> [N, Q, h]."""
        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(*y.shape[:2], self.num_heads, -1).transpose(1, 2)

        a = self.attention
        out = sdpa(heads(a.query(x)), heads(a.key(context)), heads(a.value(context)))
        return self.output(out.transpose(1, 2).reshape(x.shape), x)


class QFormerFeedForward(nn.Module):
    def __init__(self, config: QFormerConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)


class QFormerLayer(nn.Module):
    def __init__(self, config: QFormerConfig, index: int) -> None:
        super().__init__()
        self.attention = QFormerAttention(config, config.hidden_size)
        self.crossattention = (QFormerAttention(config, config.encoder_hidden_size)
                               if index % config.cross_attention_frequency == 0 else None)
        self.intermediate_query = QFormerFeedForward(config)
        self.output_query = QFormerResidual(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, x)
        if self.crossattention is not None:
            x = self.crossattention(x, audio)
        up = self.intermediate_query
        return self.output_query(up.act(up.dense(x)), x)


class QFormerLayers(nn.Module):
    def __init__(self, config: QFormerConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(QFormerLayer(config, i) for i in range(config.num_hidden_layers))


class QFormer(nn.Module):
    def __init__(self, config: QFormerConfig) -> None:
        super().__init__()
        self.layernorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = QFormerLayers(config)

    def forward(self, queries: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        x = self.layernorm(queries)
        for layer in self.encoder.layer:
            x = layer(x, audio)
        return x


class WindowProjector(nn.Module):
    def __init__(self, config: GraniteSpeechConfig) -> None:
        super().__init__()
        self.window = config.window_size
        self.query = nn.Parameter(torch.zeros(1, config.num_queries, config.projector_config.hidden_size))
        self.qformer = QFormer(config.projector_config)
        self.linear = Linear(config.projector_config.hidden_size, config.text_config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, T, d] (zero past each row's frames) -> [B, ceil(T / window) * num_queries, d_text]."""
        b, t, d = hidden.shape
        windows = -(-t // self.window)
        x = F.pad(hidden, (0, 0, 0, windows * self.window - t)).view(b * windows, self.window, d)
        queries = self.query.to(x.dtype).expand(b * windows, -1, -1)
        return self.linear(self.qformer(queries, x)).reshape(b, windows * self.query.shape[1], -1)
