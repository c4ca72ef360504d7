"""MoonViT, Kimi's native-resolution ViT: packed images of any size in, 2x2-merged tokens out.

Weights use the tensor names of transformers' `Kimi_K25VisionModel` (see moonvit_weights.py
for reading the K2.5 and Kimi-VL checkpoint layouts into them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from graft.errors import GraftDataError
from graft.kernels import apply_rotary, rope_cos_sin


@dataclass
class MoonViTConfig:
    patch_size: int = 14  # pixels per patch side
    hidden_size: int = 1152  # width of every block
    intermediate_size: int = 4304  # MLP width
    num_attention_heads: int = 16  # heads per block (head_dim must be divisible by 4)
    num_hidden_layers: int = 27  # transformer blocks
    pos_emb_height: int = 64  # rows of the learned absolute position grid
    pos_emb_width: int = 64  # columns of the learned absolute position grid
    merge_kernel_size: tuple[int, int] = (2, 2)  # patches merged into one output token
    rope_theta: float = 10000.0  # 2D RoPE base
    max_grid_side: int = 512  # largest patch grid side: Kimi's 2D RoPE table is 512 x 512
    layer_norm_eps: float = 1e-5  # every LayerNorm in the tower

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def merged_size(self) -> int:
        """Width of one output token: the merged patches concatenated."""
        return self.hidden_size * self.merge_kernel_size[0] * self.merge_kernel_size[1]


class PositionEmbedding(nn.Module):
    """Learned (H, W, d) grid, bicubically resampled to each image's patch grid."""

    def __init__(self, cfg: MoonViTConfig):
        super().__init__()
        self.position_embeddings = nn.Parameter(
            torch.zeros(cfg.pos_emb_height, cfg.pos_emb_width, cfg.hidden_size))

    def forward(self, grids: list[tuple[int, int]]) -> torch.Tensor:
        table = self.position_embeddings
        out = []
        for h, w in grids:
            if (h, w) == tuple(table.shape[:2]):
                out.append(table.reshape(h * w, -1))
                continue
            grid = table.permute(2, 0, 1).unsqueeze(0)  # [1, d, H, W]
            grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
            out.append(grid.squeeze(0).permute(1, 2, 0).reshape(h * w, -1))  # [h*w, d]
        return torch.cat(out)


class PatchEmbed(nn.Module):
    def __init__(self, cfg: MoonViTConfig):
        super().__init__()
        p = cfg.patch_size
        self.proj = nn.Conv2d(3, cfg.hidden_size, kernel_size=p, stride=p)
        self.pos_emb = PositionEmbedding(cfg)

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int]]) -> torch.Tensor:
        x = self.proj(patches).flatten(1)  # [n_patches, d]
        return x + self.pos_emb(grids).to(x.dtype)


def patch_positions(grids: list[tuple[int, int]], device=None) -> torch.Tensor:
    """(row, col) of every patch, images packed in raster order: [n_patches, 2]."""
    parts = []
    for h, w in grids:
        rows = torch.arange(h, device=device).repeat_interleave(w)
        cols = torch.arange(w, device=device).repeat(h)
        parts.append(torch.stack([rows, cols], dim=-1))
    return torch.cat(parts)


class Attention(nn.Module):
    def __init__(self, cfg: MoonViTConfig):
        super().__init__()
        d = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, cu_seqlens: list[int], cos, sin) -> torch.Tensor:
        n = x.shape[0]
        # Kimi rotates in fp32 whatever the weights dtype: cos/sin stay fp32 on purpose.
        q = apply_rotary(self.q_proj(x).view(n, self.heads, -1), cos, sin)  # [n, heads, hd]
        k = apply_rotary(self.k_proj(x).view(n, self.heads, -1), cos, sin)
        v = self.v_proj(x).view(n, self.heads, -1)
        out = torch.empty_like(v)
        # Block-diagonal attention: each image attends only to its own patches.
        for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [heads, len, hd]
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
        return self.proj(out.reshape(n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: MoonViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: MoonViTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, cu_seqlens, cos, sin):
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin)
        return x + self.mlp(self.norm2(x))


class MoonViT(nn.Module):
    """patches [n_patches, 3, p, p] + grids [(h, w)] -> one [h*w/4, 4*d] tensor per image."""

    def __init__(self, cfg: MoonViTConfig):
        super().__init__()
        if cfg.head_dim % 4:
            raise ValueError(
                f"MoonViT head_dim={cfg.head_dim} (hidden_size/num_attention_heads) must be "
                "divisible by 4 for its 2D RoPE")
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.final_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def inv_freq(self, device) -> torch.Tensor:
        """Frequencies shared by both axes; computed per call so meta-device builds stay valid."""
        quarter = self.cfg.head_dim // 2
        exponents = torch.arange(0, quarter, 2, dtype=torch.float, device=device) / quarter
        return 1.0 / self.cfg.rope_theta ** exponents  # [head_dim / 4]

    def check_grids(self, grids: list[tuple[int, int]], n_patches: int) -> None:
        kh, kw = self.cfg.merge_kernel_size
        side = self.cfg.max_grid_side
        for i, (h, w) in enumerate(grids):
            if h < 1 or w < 1 or h % kh or w % kw:
                raise GraftDataError(
                    f"image {i}: patch grid {h}x{w} must be positive multiples of the merge "
                    f"kernel {kh}x{kw}; preprocess images with the encoder's processor")
            if h > side or w > side:
                raise GraftDataError(
                    f"image {i}: patch grid {h}x{w} exceeds MoonViT's position table of "
                    f"{side}x{side} patches (max_grid_side); resize the image below "
                    f"{side * self.cfg.patch_size} px per side or set max_image_tokens")
        expected = sum(h * w for h, w in grids)
        if expected != n_patches:
            raise GraftDataError(
                f"pixel patches: got {n_patches} patches but the grids {grids} need {expected}")

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int]],
                feature_layer: int = -1) -> list[torch.Tensor]:
        grids = [(int(h), int(w)) for h, w in grids]
        self.check_grids(grids, patches.shape[0])
        x = self.patch_embed(patches.to(self.patch_embed.proj.weight.dtype), grids)  # [n, d]
        # Kimi's axial 2D RoPE: angle columns (w*f0, h*f0, w*f1, ...) rotate the pairs
        # (i, i + head_dim/2); the q/k rows of Kimi-VL's complex layout are permuted to
        # match on load (moonvit_weights).
        cos, sin = rope_cos_sin(patch_positions(grids, x.device), self.inv_freq(x.device))
        cu = [0]
        for h, w in grids:
            cu.append(cu[-1] + h * w)
        n_layers = len(self.layers)
        # feature_layer indexes HF-style hidden_states (0 = embeddings, k = after block k).
        if not -(n_layers + 1) <= feature_layer <= n_layers:
            raise ValueError(f"feature_layer={feature_layer} outside [-{n_layers + 1}, {n_layers}]")
        n_run = feature_layer % (n_layers + 1)
        for layer in self.layers[:n_run]:
            x = layer(x, cu, cos, sin)
        if n_run == n_layers:  # Kimi's projector reads the final-normed tower output
            x = self.final_layernorm(x)
        return [self.merge(x[s:e], g) for s, e, g in zip(cu[:-1], cu[1:], grids)]

    def merge(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """[h*w, d] -> [(h/kh)*(w/kw), kh*kw*d], each kernel's patches concatenated row-major."""
        (h, w), (kh, kw) = grid, self.cfg.merge_kernel_size
        x = x.view(h // kh, kh, w // kw, kw, -1).permute(0, 2, 1, 3, 4)
        return x.reshape((h // kh) * (w // kw), -1)
