#!/usr/bin/env python3
"""JPEG files and what Pillow decodes them to: tests/fixtures/jpeg/ (vision's JPEG decoder tests).

  python3 tools/jpeg_reference.py --out tests/fixtures/jpeg

transformers' `load_image` opens a picture with PIL and converts it to RGB; for a JPEG that is
libjpeg-turbo's decompression with its defaults (islow IDCT, fancy upsampling), and on x86-64 its
AVX2 kernels. vision::preprocess::jpeg follows it bit for bit. Each case here is a small seeded
picture encoded by Pillow (4:4:4 / 4:2:2 / 4:2:0, baseline, optimized, progressive, restart
markers, gray, CMYK; two with their quantization tables scaled up, so the IDCT leaves 16 bits,
where libjpeg-turbo's AVX2 and C paths part; three with their scan data cut short and an end marker
appended, one of them progressive, which libjpeg block-smooths and our decoder declines) or by
simplejpeg (libjpeg-turbo's own encoder: 4:4:0, 4:1:1 and YCCK, which Pillow cannot write), at
sizes that hit every edge case (1x1, one row, one column, widths and
heights that are not a multiple of the MCU). Written per case:
  <name>.jpg        the file
  <name>.png        `Image.open(<name>.jpg).convert("RGB")`, losslessly (PIL's bytes to match)
and cases.json: name, how it was encoded, size, `expect` ("native": our decoder must give PIL's
bytes; "fallback": it must decline, and the `image` crate decodes it), and
`c_differs`: how many samples libjpeg-turbo's plain C path (JSIMD_FORCENONE=1) gives differently
from the SIMD path Pillow ran (non-zero where the AVX2 IDCT's 16-bit lanes wrap or saturate).

Versions: Pillow 13.0.0 (libjpeg-turbo, jpeg API 6.2), simplejpeg 1.9.0, numpy 2.4.6. Seeded.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys

import numpy as np
import PIL
from PIL import Image


def picture(h: int, w: int, kind: str, rng: np.random.Generator) -> Image.Image:
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    if kind == "noise":
        rgb = rng.random((h, w, 3))
    elif kind == "gradient":
        rgb = np.stack([xx, yy, 1 - xx * yy], -1) + 0.08 * rng.standard_normal((h, w, 3))
    elif kind == "checker":  # hard chroma edges: what fancy upsampling's edge cases show on
        c = ((np.floor(yy * 7) + np.floor(xx * 5)) % 2)[..., None]
        rgb = c * np.array([1.0, 0.0, 0.2]) + (1 - c) * np.array([0.0, 0.9, 1.0])
    else:
        raise ValueError(kind)
    return Image.fromarray((np.clip(rgb, 0, 1) * 255).round().astype(np.uint8), "RGB")


def pil_jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", **kw)
    return buf.getvalue()


def scale_quant_tables(data: bytes, factor: int) -> bytes:
    """The same file with every 8-bit DQT entry multiplied by `factor` (capped at 255): a valid JPEG
    whose dequantized coefficients (and IDCT passes) leave 16 bits, where libjpeg-turbo's AVX2 IDCT
    wraps and saturates and its C IDCT does not."""
    out = bytearray(data)
    at = 2
    while at + 4 <= len(out) and out[at] == 0xFF:
        marker, length = out[at + 1], int.from_bytes(out[at + 2:at + 4], "big")
        if marker == 0xDA:
            break
        if marker == 0xDB:
            p = at + 4
            while p < at + 2 + length:
                assert out[p] >> 4 == 0, "16-bit DQT"
                for k in range(64):
                    out[p + 1 + k] = min(255, out[p + 1 + k] * factor)
                p += 65
        at += 2 + length
    return bytes(out)


def simplejpeg_jpeg(im: Image.Image, quality: int, sub: str) -> bytes:
    import simplejpeg

    return simplejpeg.encode_jpeg(np.ascontiguousarray(np.asarray(im)), quality=quality, colorspace="RGB",
                                  colorsubsampling=sub)


CASES = [
    # name, (h, w), kind, encoder, options
    ("pil_444_q95_37x23", (23, 37), "gradient", "pil", dict(quality=95, subsampling=0)),
    ("pil_422_q80_45x31", (31, 45), "checker", "pil", dict(quality=80, subsampling=1)),
    ("pil_420_q90_90x200", (200, 90), "checker", "pil", dict(quality=90, subsampling=2)),
    ("pil_420_q75_1x1", (1, 1), "noise", "pil", dict(quality=75, subsampling=2)),
    ("pil_420_q50_17x1", (1, 17), "gradient", "pil", dict(quality=50, subsampling=2)),
    ("pil_420_q50_1x17", (17, 1), "gradient", "pil", dict(quality=50, subsampling=2)),
    ("pil_420_q30_3x5", (5, 3), "checker", "pil", dict(quality=30, subsampling=2)),
    ("pil_420_q100_noise_48x40", (40, 48), "noise", "pil", dict(quality=100, subsampling=2)),
    ("pil_444_q100_noise_33x29", (29, 33), "noise", "pil", dict(quality=100, subsampling=0)),
    ("pil_420_optimize_q85_61x47", (47, 61), "gradient", "pil", dict(quality=85, subsampling=2, optimize=True)),
    ("pil_progressive_420_q85_61x47", (47, 61), "checker", "pil", dict(quality=85, subsampling=2, progressive=True)),
    ("pil_progressive_444_q97_noise_35x26", (26, 35), "noise", "pil", dict(quality=97, subsampling=0,
                                                                             progressive=True)),
    ("pil_progressive_422_q60_77x19", (19, 77), "gradient", "pil", dict(quality=60, subsampling=1, progressive=True,
                                                                          optimize=True)),
    ("pil_restart_blocks_420_q90_64x40", (40, 64), "checker", "pil", dict(quality=90, subsampling=2,
                                                                            restart_marker_blocks=1)),
    ("pil_restart_rows_444_q70_50x33", (33, 50), "gradient", "pil", dict(quality=70, subsampling=0,
                                                                           restart_marker_rows=1)),
    ("pil_restart_progressive_420_q80_45x45", (45, 45), "noise", "pil", dict(quality=80, subsampling=2,
                                                                              progressive=True,
                                                                              restart_marker_blocks=3)),
    ("pil_gray_q90_33x21", (21, 33), "gradient", "pil-gray", dict(quality=90)),
    ("pil_gray_progressive_q75_19x40", (40, 19), "noise", "pil-gray", dict(quality=75, progressive=True)),
    ("simplejpeg_440_q89_noise_25x63", (63, 25), "noise", "simplejpeg", dict(quality=89, sub="440")),
    ("simplejpeg_440_q70_31x9", (9, 31), "checker", "simplejpeg", dict(quality=70, sub="440")),
    ("simplejpeg_411_q80_50x30", (30, 50), "checker", "simplejpeg", dict(quality=80, sub="411")),
    ("simplejpeg_411_q95_noise_7x13", (13, 7), "noise", "simplejpeg", dict(quality=95, sub="411")),
    ("pil_444_q100_dqt_x12_noise_16x16", (16, 16), "noise", "pil-dqt", dict(quality=100, subsampling=0, factor=12)),
    ("pil_420_q100_dqt_x40_noise_24x24", (24, 24), "noise", "pil-dqt", dict(quality=100, subsampling=2, factor=40)),
    # Scan data cut short, EOI appended (a damaged file PIL still opens): libjpeg reads zeros past the
    # data and leaves the rest of the segment gray; with restart markers, its resync.
    ("pil_420_cut_scan_eoi_90x200", (200, 90), "checker", "pil-cut", dict(quality=90, subsampling=2, keep=0.6)),
    ("pil_restart_cut_scan_eoi_64x40", (40, 64), "gradient", "pil-cut", dict(quality=90, subsampling=2,
                                                                           restart_marker_blocks=2, keep=0.55)),
    ("pil_cmyk_q90_24x16", (16, 24), "gradient", "pil-cmyk", dict(quality=90)),
    ("simplejpeg_ycck_420_q90_30x20", (20, 30), "gradient", "simplejpeg-cmyk", dict(quality=90, sub="420")),
    # Cut before its last scans: libjpeg smooths the blocks (not followed here: the image crate decodes).
    ("pil_progressive_cut_smoothed_61x47", (47, 61), "checker", "pil-cut", dict(quality=85, subsampling=2,
                                                                               progressive=True, keep=0.45)),
]

C_DECODE = """
import sys, numpy as np
from PIL import Image
for path in sys.argv[1:]:
    sys.stdout.buffer.write(np.asarray(Image.open(path).convert("RGB")).tobytes())
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/jpeg")
    ap.add_argument("--seed", type=int, default=4242)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    cases = []
    for name, (h, w), kind, encoder, opts in CASES:
        im = picture(h, w, kind, rng)
        if encoder == "pil":
            data = pil_jpeg(im, **opts)
        elif encoder == "pil-gray":
            data = pil_jpeg(im.convert("L"), **opts)
        elif encoder == "pil-dqt":
            kw = {k: v for k, v in opts.items() if k != "factor"}
            data = scale_quant_tables(pil_jpeg(im, **kw), opts["factor"])
        elif encoder == "pil-cut":
            full = pil_jpeg(im, **{k: v for k, v in opts.items() if k != "keep"})
            data = full[: int(len(full) * opts["keep"])].rstrip(b"\xff") + b"\xff\xd9"
        elif encoder == "simplejpeg-cmyk":
            import simplejpeg

            cmyk = np.ascontiguousarray(np.asarray(im.convert("CMYK")))
            data = simplejpeg.encode_jpeg(cmyk, quality=opts["quality"], colorspace="CMYK",
                                          colorsubsampling=opts["sub"])
        elif encoder == "pil-cmyk":
            data = pil_jpeg(im.convert("CMYK"), **opts)
        else:
            data = simplejpeg_jpeg(im, opts["quality"], opts["sub"])
        jpg = os.path.join(args.out, name + ".jpg")
        with open(jpg, "wb") as f:
            f.write(data)
        with Image.open(jpg) as opened:
            rgb = opened.convert("RGB")
            layers = [list(x) for x in getattr(opened, "layer", [])]
        rgb.save(os.path.join(args.out, name + ".png"), optimize=False)
        c = subprocess.run([sys.executable, "-c", C_DECODE, jpg], capture_output=True, check=True,
                           env=dict(os.environ, JSIMD_FORCENONE="1")).stdout
        c_differs = int((np.frombuffer(c, np.uint8) != np.asarray(rgb).reshape(-1)).sum())
        cases.append(dict(name=name, size=[w, h], picture=kind, encoder=encoder, options=opts,
                          components=layers, expect="fallback" if "smoothed" in name else "native",
                          c_differs=c_differs, bytes=len(data)))
        print(f"{name}: {len(data)} bytes, components {layers}, C path differs on {c_differs} samples")
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(dict(pillow=PIL.__version__, seed=args.seed, cases=cases), f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
