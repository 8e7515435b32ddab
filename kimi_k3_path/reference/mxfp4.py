"""MXFP4 (OCP Microscaling, E2M1 elements with one E8M0 scale per 32) pack and unpack over the last dimension.

Layout (what vLLM's MXFP4 checkpoints and our kernels use): `packed` uint8 [..., K/2] with element 2i in the low
nibble of byte i and element 2i+1 in the high nibble; `scales` uint8 [..., K/32] holding E8M0 exponents, so the
group's scale is 2^(s - 127). An E2M1 nibble is sign(1) | exponent(2) | mantissa(1):
|value| = mantissa * 0.5 when the exponent is 0, else 2^(exponent-1) * (1 + mantissa/2).
"""

from __future__ import annotations

import torch

MX_BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 255  # the one E8M0 encoding that is not a power of two
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of the largest E2M1 value (6 = 1.5 * 2^2): the OCP rule's offset for the shared scale
# |value| of the magnitude codes 0..7; codes 8..15 are the same magnitudes negated.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes; at an exact midpoint round-to-nearest-even picks the even code.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e2m1_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 E2M1 values indexed by nibble, fp32."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def _check_last_dim(k: int, what: str) -> None:
    if k % MX_BLOCK:
        raise ValueError(f"{what}: last dimension {k} is not a multiple of the MX block size {MX_BLOCK}")


def _e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 values (already divided by their scale) to E2M1 nibbles: nearest, ties to even, saturating at 6."""
    mag = v.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for lower_code, threshold in enumerate(_MIDPOINTS):
        # A tie goes up only when the upper neighbour's code is even.
        above = mag >= threshold if lower_code % 2 else mag > threshold
        code += above.to(torch.uint8)
    sign = (v < 0) & (code > 0)  # never emit -0, so pack(unpack(x)) is canonical
    return code | (sign.to(torch.uint8) << 3)


def mxfp4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `w` [..., K] to (packed uint8 [..., K/2], scales uint8 [..., K/32]) with the OCP MX scale rule.

    The shared exponent is floor(log2(amax)) - 2 (E2M1's emax), so the group maximum lands in [4, 8) and values
    above 6 saturate; an all-zero group gets exponent byte 0.
    """
    _check_last_dim(w.shape[-1], "mxfp4_pack")
    if not torch.isfinite(w).all():
        raise ValueError("mxfp4_pack: input has NaN or infinite values, which MXFP4 cannot represent here")
    groups = w.float().reshape(*w.shape[:-1], -1, MX_BLOCK)
    amax = groups.abs().amax(dim=-1)
    # frexp gives amax = m * 2^e with m in [0.5, 1): floor(log2(amax)) = e - 1, exact for every finite amax.
    _, exponent = torch.frexp(amax)
    shared = (exponent.to(torch.int32) - 1 - E2M1_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS)
    shared = torch.where(amax > 0, shared, torch.full_like(shared, -E8M0_BIAS))
    scale = torch.exp2(shared.float())
    codes = _e2m1_encode(groups / scale.unsqueeze(-1)).reshape(w.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), (shared + E8M0_BIAS).to(torch.uint8)


def mxfp4_unpack(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Dequantize (packed [..., K/2], scales [..., K/32]) to fp32 [..., K]."""
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"mxfp4_unpack: packed and scales must be uint8, got {packed.dtype} and {scales.dtype}")
    k = packed.shape[-1] * 2
    _check_last_dim(k, "mxfp4_unpack")
    if tuple(scales.shape) != (*packed.shape[:-1], k // MX_BLOCK):
        raise ValueError(
            f"mxfp4_unpack: scales shape {tuple(scales.shape)} does not match packed {tuple(packed.shape)}; "
            f"expected {(*packed.shape[:-1], k // MX_BLOCK)}"
        )
    if (scales == E8M0_NAN).any():
        raise ValueError("mxfp4_unpack: scale byte 255 is E8M0 NaN")
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], k)
    values = e2m1_table(packed.device)[codes.long()]
    scale = torch.exp2(scales.float() - E8M0_BIAS)
    return (values.reshape(*packed.shape[:-1], -1, MX_BLOCK) * scale.unsqueeze(-1)).reshape(values.shape)
