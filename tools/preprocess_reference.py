#!/usr/bin/env python3
"""Test images and transformers' preprocessing of them: tests/fixtures/preprocess/ (vision's preprocess tests).

  python3 tools/preprocess_reference.py --out tests/fixtures/preprocess

The reference is transformers 5.x's PIL/NumPy image processor for Qwen3-VL, `Qwen2VLImageProcessorPil`
(the one transformers uses without torchvision), called on the file path as `Qwen3VLProcessor` calls it:
`fetch_images` (= `load_image`: PIL open, `exif_transpose`, `convert("RGB")`), `process_image`
(`convert_to_rgb`), `resize` (`smart_resize` + Pillow's `Image.resize`), `rescale`, `normalize`,
`patchify`. Two configs: the tiny chat checkpoint's preprocessor_config.json
(tests/fixtures/chat/Qwen3-VL-tiny: min 1024, max 4194304 pixels) and Qwen3-VL-2B-Instruct's
(min 65536, max 16777216; written here as qwen3-vl-2b.preprocessor_config.json).

Images are synthetic and seeded (gradients, hard edges, thin lines, a noise patch: the resize's
antialiasing shows on all of them), small files. Written per case into cases.json:
  file, config, min_pixels/max_pixels overrides, size_in (after EXIF), size_resized, grid,
  decoded_fnv1a64 / resized_fnv1a64 (FNV-1a 64 of the RGB bytes, rows top to bottom),
  exact (whether the decoder is expected to equal PIL's bit for bit: not for lossy JPEG / WebP).
and into reference.safetensors (sorted header):
  <case>.resized    U8 [h, w, 3]  the uint8 image transformers rescales (PIL's resize output), for the
                    inexact cases (to measure the difference) and cases up to 20 000 resized pixels;
                    the others are checked by their hash
  <case>.row_index  I64 [k]       pixel_values rows kept (all rows up to 8 rows, else 3 spread rows)
  <case>.rows       F32 [k, 1536] those rows of transformers' pixel_values
  <case>.row_sums   F64 [rows]    every row's sum (float64, ascending index)
resize_sweep in cases.json: Pillow's Image.resize alone on a seeded noise picture (sweep.source U8
[47, 61, 3]) to several sizes with every convolution filter (sweep.<filter>.<w>x<h> U8).
Refusal cases (refusals in cases.json) are files our loader must refuse by name; what transformers does
with them is recorded beside.

--fast-report (needs torchvision; not used for the fixtures) prints how far transformers' torchvision
"fast" processor (Qwen2VLImageProcessor) lands from the PIL one on every committed case, in uint8 levels
of pixel_values (1 level = 2/255 with mean = std = 0.5): through its own path (torchvision decode) and
with the same PIL-decoded image (the resize alone).

The script checks that its step-by-step uint8 image, rescaled / normalized / patchified by the processor's
own methods, equals pixel_values from the processor's __call__ exactly.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
import warnings
import zlib

import numpy as np
import PIL
from PIL import Image, PngImagePlugin
import transformers
from transformers.image_utils import SizeDict
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join(ROOT, "tests/fixtures/chat/Qwen3-VL-tiny/preprocessor_config.json")
CONFIG_2B = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": 2,
    "patch_size": 16,
    "processor_class": "Qwen3VLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "temporal_patch_size": 2,
}
# The other switches of the config, on top of the tiny checkpoint's (written beside as <name>.preprocessor_config.json).
CONFIG_VARIANTS = {
    "clip-bilinear": {"resample": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711], "temporal_patch_size": 1},
    "no-rescale-no-normalize": {"do_rescale": False, "do_normalize": False},
    "no-resize": {"do_resize": False, "patch_size": 14, "merge_size": 2},
}
KEEP_RESIZED = 20_000
ALL_ROWS = 8
SPREAD_ROWS = 3


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    arr = np.frombuffer(data, dtype=np.uint8)
    # Pure-Python FNV over megabytes is slow; do it in chunks of numpy work where possible.
    for b in arr.tolist():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ---- synthetic pictures -------------------------------------------------------------------------

def synth(width: int, height: int, seed: int, block: int = 1) -> np.ndarray:
    """An RGB uint8 picture with smooth gradients, hard-edged boxes, thin lines and a noise patch.

    `block` > 1 draws the gradients in blocks of that many pixels (small PNG files for the big cases);
    the lines and the noise patch stay one pixel wide."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    y, x = y // block * block, x // block * block
    img = np.zeros((height, width, 3), dtype=np.float64)
    for c in range(3):
        fx, fy, ph = rng.uniform(8, 40), rng.uniform(8, 40), rng.uniform(0, 6.3)
        img[..., c] = 128 + 90 * np.sin(x / fx + ph) * np.cos(y / fy - ph)
    for _ in range(6):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        bw, bh = rng.integers(1, max(2, width // 3)), rng.integers(1, max(2, height // 3))
        img[y0:y0 + bh, x0:x0 + bw] = rng.integers(0, 256, size=3)
    for _ in range(4):  # one-pixel lines: the antialiasing shows on these
        if rng.random() < 0.5:
            img[rng.integers(0, height), :] = rng.integers(0, 256, size=3)
        else:
            img[:, rng.integers(0, width)] = rng.integers(0, 256, size=3)
    n = min(24, width, height)
    ny, nx = rng.integers(0, height - n + 1), rng.integers(0, width - n + 1)
    img[ny:ny + n, nx:nx + n] = rng.integers(0, 256, size=(n, n, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(width, height, color_type, bit_depth, rows, plte=None, trns=None, exif=None, ihdr_size=None):
    """A PNG written by hand: the layouts PIL cannot write (16-bit RGB, tRNS on gray / RGB, eXIf)."""
    w, h = ihdr_size or (width, height)
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0))
    if exif is not None:
        out += png_chunk(b"eXIf", exif)
    if plte is not None:
        out += png_chunk(b"PLTE", plte)
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    raw = b"".join(b"\x00" + r for r in rows)
    return out + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")


def gif_with_sub_frame(screen, frame_box, indices, palette, background=0, transparency=None) -> bytes:
    """A one-frame GIF whose frame covers only part of its logical screen (PIL always writes the first frame
    full-screen). Four colours; LZW written as clear code + literal per pixel (valid, just not compressed)."""
    sw, sh = screen
    fx, fy, fw, fh = frame_box
    out = b"GIF89a" + struct.pack("<HHBBB", sw, sh, 0x80 | 0x01, background, 0) + bytes(palette)
    if transparency is not None:
        out += b"\x21\xf9\x04\x01\x00\x00" + bytes([transparency]) + b"\x00"
    min_code, bits, nbits, data = 2, 0, 0, bytearray()
    for code in [c for i in indices for c in (1 << min_code, int(i))] + [(1 << min_code) + 1]:
        bits |= code << nbits
        nbits += min_code + 1
        while nbits >= 8:
            data.append(bits & 255)
            bits >>= 8
            nbits -= 8
    if nbits:
        data.append(bits & 255)
    out += b"\x2c" + struct.pack("<HHHHB", fx, fy, fw, fh, 0) + bytes([min_code])
    for i in range(0, len(data), 255):
        out += bytes([len(data[i:i + 255])]) + bytes(data[i:i + 255])
    return out + b"\x00\x3b"


def exif_orientation(value: int, jpeg_header: bool = True) -> bytes:
    """An EXIF block holding only the orientation; without the "Exif\\0\\0" header for a PNG eXIf chunk
    (bare TIFF, as the PNG spec has it)."""
    exif = Image.Exif()
    exif[0x0112] = value
    data = exif.tobytes()
    return data if jpeg_header else data.removeprefix(b"Exif\x00\x00")


def palette_image(width, height, seed, colors=16):
    rgb = Image.fromarray(synth(width, height, seed))
    return rgb.quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)


# ---- the cases ------------------------------------------------------------------------------------

def cases():
    """(name, file name, bytes, config, overrides, exact)."""
    out = []

    def add(name, ext, data, config="tiny", min_pixels=None, max_pixels=None, exact=True, file=None):
        out.append(dict(name=name, file=file or f"{name}.{ext}", data=data, config=config,
                        min_pixels=min_pixels, max_pixels=max_pixels, exact=exact))

    # The config's other switches.
    add("clip_bilinear_333x517", "png", encode(Image.fromarray(synth(333, 517, 41)), "PNG", optimize=True),
        config="clip-bilinear")
    add("raw_values_90x70", "png", encode(Image.fromarray(synth(90, 70, 42)), "PNG"), config="no-rescale-no-normalize")
    add("no_resize_112x56", "png", encode(Image.fromarray(synth(112, 56, 43)), "PNG"), config="no-resize")

    # The bundled default model's pictures (tests/fixtures/chat), as the engine will feed them.
    add("chat_picture_1", "png", None, file="../chat/picture-1.png")
    add("chat_picture_2", "png", None, file="../chat/picture-2.png")

    hd = Image.fromarray(synth(1280, 720, 1, block=4))
    add("hd_1280x720", "png", encode(hd, "PNG", optimize=True), config="2b")
    add("tiny_20x14", "png", encode(Image.fromarray(synth(20, 14, 2)), "PNG"), config="2b")
    add("tiny_7x5_tinycfg", "png", encode(Image.fromarray(synth(7, 5, 3)), "PNG"))
    add("wide_1500x40", "png", encode(Image.fromarray(synth(1500, 40, 4, block=2)), "PNG", optimize=True), config="2b")
    add("tall_30x2000", "png", encode(Image.fromarray(synth(30, 2000, 5, block=2)), "PNG", optimize=True), config="2b")
    add("over_max_2200x2000", "png", encode(Image.fromarray(synth(2200, 2000, 6, block=8)), "PNG", optimize=True))
    add("max_override_640x480", "png", encode(Image.fromarray(synth(640, 480, 7, block=2)), "PNG", optimize=True),
        config="2b", max_pixels=100_000)
    add("min_override_97x61", "png", encode(Image.fromarray(synth(97, 61, 8)), "PNG"), config="2b",
        min_pixels=200_000)
    add("odd_333x517", "png", encode(Image.fromarray(synth(333, 517, 9)), "PNG", optimize=True), config="2b")
    add("odd_517x333_tinycfg", "png", encode(Image.fromarray(synth(517, 333, 10)), "PNG", optimize=True))
    gray = Image.fromarray(synth(300, 200, 11)).convert("L")
    add("gray_300x200", "png", encode(gray, "PNG"), config="2b")
    rgba = np.dstack([synth(256, 192, 12), synth(256, 192, 13)[..., 0]])
    add("rgba_256x192", "png", encode(Image.fromarray(rgba, "RGBA"), "PNG"), config="2b")
    la = np.dstack([synth(120, 90, 14)[..., 0], synth(120, 90, 15)[..., 1]])
    add("gray_alpha_120x90", "png", encode(Image.fromarray(la, "LA"), "PNG"))
    pal = palette_image(200, 150, 16)
    add("palette_200x150", "png", encode(pal, "PNG"), config="2b")
    add("palette_one_transparent_200x150", "png", encode(pal, "PNG", transparency=3), config="2b")
    add("palette_alpha_levels_200x150", "png", encode(pal, "PNG", transparency=bytes([0, 128, 255, 7])), config="2b")
    g8 = np.asarray(gray)[:64, :96]
    add("gray_trns_96x64", "png", raw_png(96, 64, 0, 8, [r.tobytes() for r in g8], trns=struct.pack(">H", int(g8[10, 10]))))
    rgb8 = synth(96, 64, 17)
    add("rgb_trns_96x64", "png", raw_png(96, 64, 2, 8, [r.tobytes() for r in rgb8],
                                         trns=struct.pack(">3H", *[int(v) for v in rgb8[5, 5]])))
    rng = np.random.default_rng(18)
    g16 = (synth(80, 60, 18)[..., 0].astype(np.uint16) * 257 + rng.integers(0, 257, (60, 80))).astype(np.uint16)
    g16[:20] //= 200  # some samples at or below 255: PIL clips I;16 to 255 rather than scaling
    add("gray16_80x60", "png", raw_png(80, 60, 0, 16, [r.astype(">u2").tobytes() for r in g16]))
    rgb16 = synth(80, 60, 19).astype(np.uint16) * 257 + rng.integers(0, 257, (60, 80, 3)).astype(np.uint16)
    add("rgb16_80x60", "png", raw_png(80, 60, 2, 16, [r.astype(">u2").tobytes() for r in rgb16]))
    g4 = (synth(64, 40, 20)[..., 0] >> 4).astype(np.uint8)
    add("gray4bit_64x40", "png", raw_png(64, 40, 0, 4, [bytes((r[i] << 4) | r[i + 1] for i in range(0, 64, 2)) for r in g4]))
    add("png_exif8_96x64", "png", raw_png(96, 64, 2, 8, [r.tobytes() for r in synth(96, 64, 21)],
                                          exif=exif_orientation(8, jpeg_header=False)))
    # PIL writes (and reads) eXIf with the JPEG header kept.
    add("png_exif6_pil_style_96x64", "png", encode(Image.fromarray(synth(96, 64, 21)), "PNG", exif=exif_orientation(6)))
    # Orientation only in the XMP packet (Pillow's getexif falls back to tiff:Orientation).
    xmp = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
           '<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="{}"/></rdf:RDF></x:xmpmeta>')
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp.format(6))
    add("png_xmp6_96x64", "png", encode(Image.fromarray(synth(96, 64, 45)), "PNG", pnginfo=info))
    add("webp_lossless_xmp8_96x64", "webp",
        encode(Image.fromarray(synth(96, 64, 46)), "WEBP", lossless=True, xmp=xmp.format(8).encode()))
    photo = Image.fromarray(synth(200, 150, 22))
    add("jpeg_exif6_200x150", "jpg", encode(photo, "JPEG", quality=90, exif=exif_orientation(6)), exact=False)
    add("jpeg_exif8_q95_444_200x150", "jpg", encode(photo, "JPEG", quality=95, subsampling=0,
                                                    exif=exif_orientation(8)), exact=False)
    add("jpeg_cmyk_96x64", "jpg", encode(Image.fromarray(synth(96, 64, 50)).convert("CMYK"), "JPEG", quality=95),
        exact=False)
    add("jpeg_gray_200x150", "jpg", encode(gray.resize((200, 150)), "JPEG", quality=90), exact=False)
    add("webp_lossless_240x160", "webp", encode(Image.fromarray(synth(240, 160, 23)), "WEBP", lossless=True), config="2b")
    add("webp_lossy_200x150", "webp", encode(Image.fromarray(synth(200, 150, 23)), "WEBP", quality=80), exact=False)
    frames = [palette_image(160, 120, 24 + i) for i in range(2)]
    add("gif_2frames_160x120", "gif", encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100),
        config="2b")
    add("gif_transparent_160x120", "gif", encode(frames[0], "GIF", transparency=2), config="2b")
    sub = np.random.default_rng(44).integers(0, 4, size=30 * 40)
    four = [200, 40, 40, 30, 160, 60, 20, 60, 220, 240, 220, 90]
    add("gif_sub_frame_96x64", "gif", gif_with_sub_frame((96, 64), (20, 10, 40, 30), sub, four, background=2))
    add("gif_sub_frame_transparent_96x64", "gif",
        gif_with_sub_frame((96, 64), (20, 10, 40, 30), sub, four, background=2, transparency=3))
    return out


# Pillow's resize alone on a noise picture: both pass orders (Pillow 13 goes vertical first when the
# height shrinks by more than twice the width), single-axis, up and down, every convolution filter.
SWEEP_SOURCE = (61, 47)
SWEEP = [(3, 30, 20), (3, 60, 12), (3, 80, 20), (3, 20, 40), (3, 61, 10), (3, 13, 47), (3, 100, 90), (3, 59, 30),
         (3, 7, 3), (3, 200, 5)] + [(f, w, h) for f in (1, 2, 4, 5) for (w, h) in ((30, 20), (80, 20), (90, 70))]


def resize_sweep(tensors: dict) -> list:
    rng = np.random.default_rng(40)
    w, h = SWEEP_SOURCE
    src = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    src[: h // 3] = src[: h // 3] // 85 * 85  # flat steps beside the noise
    tensors["sweep.source"] = src
    out = []
    for resample, width, height in SWEEP:
        key = f"sweep.{resample}.{width}x{height}"
        tensors[key] = np.asarray(Image.fromarray(src).resize((width, height), resample))
        out.append(dict(key=key, resample=resample, width=width, height=height,
                        vertical_first=width != w and (h - height) > 0 and (h - height) > (w - width) * 2))
    return out


def refusals():
    """(file name, bytes, what our loader must say): each refused by name."""
    good = encode(Image.fromarray(synth(64, 48, 30)), "PNG")
    jpeg = encode(Image.fromarray(synth(64, 48, 30)), "JPEG", quality=90)
    webp = encode(Image.fromarray(synth(64, 48, 30)), "WEBP", lossless=True)
    gif = encode(palette_image(64, 48, 30), "GIF")
    return [
        dict(file="not_an_image.png", data=b"this is a text file, not a picture\n", expect="not a PNG, JPEG, WebP or GIF"),
        dict(file="empty.png", data=b"", expect="empty"),
        dict(file="truncated.png", data=good[: len(good) // 2], expect="cannot decode"),
        dict(file="truncated.jpg", data=jpeg[: len(jpeg) // 3], expect="cannot decode"),
        dict(file="truncated.webp", data=webp[: len(webp) // 2], expect="cannot"),
        dict(file="truncated.gif", data=gif[: len(gif) // 2], expect="cannot decode"),
        dict(file="zero_width.png", data=raw_png(1, 4, 2, 8, [b"\0\0\0"] * 4, ihdr_size=(0, 4)), expect="header"),
        dict(file="huge_header_100000x100000.png",
             data=raw_png(1, 1, 2, 8, [b"\0\0\0"], ihdr_size=(100_000, 100_000)), expect="max_decoded_pixels"),
        dict(file="ratio_201_2010x10.png", data=encode(Image.fromarray(synth(2010, 10, 31)), "PNG"),
             expect="aspect ratio"),
    ]


def save_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """A safetensors file with a byte-stable header, as tools/hf_reference.py's save_safetensors (which
    takes torch F32/I64 only; these are numpy U8/I64/F32/F64): keys sorted, 8-byte aligned."""
    dtypes = {np.dtype(np.uint8): "U8", np.dtype(np.int64): "I64", np.dtype(np.float32): "F32",
              np.dtype(np.float64): "F64"}
    header: dict = {"__metadata__": {k: str(metadata[k]) for k in sorted(metadata)}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


# ---- transformers -----------------------------------------------------------------------------------

def processor(config: dict) -> Qwen2VLImageProcessorPil:
    kw = {k: v for k, v in config.items() if k not in ("image_processor_type", "processor_class")}
    return Qwen2VLImageProcessorPil(**kw)


def reference(proc, path, min_pixels, max_pixels):
    size = SizeDict(shortest_edge=min_pixels or proc.size.shortest_edge, longest_edge=max_pixels or proc.size.longest_edge)
    call_kw = {"size": {"shortest_edge": size.shortest_edge, "longest_edge": size.longest_edge}}
    out = proc(images=path, return_tensors="np", **call_kw)
    pixel_values, grid = out["pixel_values"], out["image_grid_thw"]
    # Step by step with the processor's own methods, to keep the uint8 image it rescales.
    image = proc.fetch_images(path)
    chw = proc.process_image(image, do_convert_rgb=proc.do_convert_rgb)
    factor = proc.patch_size * proc.merge_size
    resized = proc.resize(chw, size=size, resample=proc.resample, factor=factor) if proc.do_resize else chw
    x = proc.rescale(resized, proc.rescale_factor) if proc.do_rescale else resized
    x = proc.normalize(x, proc.image_mean, proc.image_std) if proc.do_normalize else x
    rows, gh, gw = proc.patchify(x, proc.patch_size, proc.merge_size, proc.temporal_patch_size)
    assert np.array_equal(rows, pixel_values), f"{path}: step-by-step rows differ from __call__"
    assert [1, gh, gw] == grid[0].tolist()
    return np.ascontiguousarray(np.moveaxis(chw, 0, -1)), np.ascontiguousarray(np.moveaxis(resized, 0, -1)), pixel_values, grid[0].tolist()


def load_configs() -> tuple[dict, dict]:
    """Every config by name, and the file (relative to the fixtures) each is read from by the tests."""
    with open(TINY_CONFIG) as f:
        configs = {"tiny": json.load(f), "2b": CONFIG_2B}
    config_files = {"tiny": "../chat/Qwen3-VL-tiny/preprocessor_config.json", "2b": "qwen3-vl-2b.preprocessor_config.json"}
    for name, change in CONFIG_VARIANTS.items():
        configs[name] = {**configs["tiny"], **change}
        config_files[name] = f"{name}.preprocessor_config.json"
    return configs, config_files


def fast_report(out: str, configs: dict) -> None:
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    level = 2 / 255
    with open(os.path.join(out, "cases.json")) as f:
        listed = json.load(f)["cases"]
    for c in listed:
        config = configs[c["config"]]
        size = {"shortest_edge": c["min_pixels"] or config["size"]["shortest_edge"],
                "longest_edge": c["max_pixels"] or config["size"]["longest_edge"]}
        slow = processor(config)
        fast = Qwen2VLImageProcessor(**{k: v for k, v in config.items() if k not in ("image_processor_type", "processor_class")})
        path = os.path.join(out, c["file"])
        ref = slow(images=path, return_tensors="np", size=size)["pixel_values"]
        try:
            own = fast(images=path, return_tensors="np", size=size)["pixel_values"]
            own_diff = f"{np.abs(own - ref).max() / level:.0f}" if own.shape == ref.shape else f"shape {own.shape} vs {ref.shape}"
        except Exception as e:
            own_diff = f"{type(e).__name__}"
        same = np.abs(fast(images=load_image(path), return_tensors="np", size=size)["pixel_values"] - ref) / level
        print(f"{c['name']}: own path {own_diff} levels; same decode: max {same.max():.0f} levels, "
              f"{np.mean(same > 0.5) * 100:.1f}% of values differ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/preprocess"))
    ap.add_argument("--fast-report", action="store_true", help="compare the torchvision processor (see above)")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    configs, config_files = load_configs()
    if args.fast_report:
        fast_report(args.out, configs)
        return
    os.makedirs(args.out, exist_ok=True)
    for name, config in configs.items():
        if name != "tiny":
            with open(os.path.join(args.out, config_files[name]), "w") as f:
                json.dump(config, f, indent=2, sort_keys=True)
                f.write("\n")
    procs = {k: processor(v) for k, v in configs.items()}
    for p in procs.values():
        assert type(p).__name__ == "Qwen2VLImageProcessorPil"

    tensors, listed = {}, []
    for case in cases():
        path = os.path.join(args.out, case["file"])
        if case["data"] is None:  # a committed picture elsewhere under tests/fixtures
            path = os.path.normpath(os.path.join(ROOT, "tests/fixtures/preprocess", case["file"]))
        else:
            with open(path, "wb") as f:
                f.write(case["data"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            decoded, resized, pv, grid = reference(procs[case["config"]], path, case["min_pixels"], case["max_pixels"])
        name = case["name"]
        n = pv.shape[0]
        assert pv.shape[1] == 3 * procs[case["config"]].temporal_patch_size * procs[case["config"]].patch_size ** 2
        index = np.arange(n) if n <= ALL_ROWS else np.unique(np.linspace(0, n - 1, SPREAD_ROWS).round().astype(np.int64))
        tensors[f"{name}.row_index"] = index.astype(np.int64)
        tensors[f"{name}.rows"] = np.ascontiguousarray(pv[index]).astype(np.float32)
        tensors[f"{name}.row_sums"] = pv.astype(np.float64).sum(axis=1)
        if not case["exact"] or resized.shape[0] * resized.shape[1] <= KEEP_RESIZED:
            tensors[f"{name}.resized"] = resized
        listed.append(dict(
            name=name, file=case["file"], config=case["config"], min_pixels=case["min_pixels"],
            max_pixels=case["max_pixels"], exact=case["exact"],
            size_in=[decoded.shape[1], decoded.shape[0]], size_resized=[resized.shape[1], resized.shape[0]],
            grid=grid, tokens=grid[0] * grid[1] * grid[2] // 4,
            decoded_fnv1a64=fnv1a64(decoded.tobytes()), resized_fnv1a64=fnv1a64(resized.tobytes()),
        ))
        print(f"{name}: {decoded.shape[1]}x{decoded.shape[0]} -> {resized.shape[1]}x{resized.shape[0]}, grid {grid}",
              file=sys.stderr)

    sweep = resize_sweep(tensors)
    refused = []
    for r in refusals():
        path = os.path.join(args.out, r["file"])
        with open(path, "wb") as f:
            f.write(r["data"])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                procs["2b"](images=path, return_tensors="np")
            transformers_says = "accepted"
        except Exception as e:  # what transformers does, for the record
            transformers_says = f"{type(e).__name__}: {str(e).replace(args.out + os.sep, '')[:160]}"
        refused.append(dict(file=r["file"], expect=r["expect"], transformers=transformers_says))

    save_safetensors(os.path.join(args.out, "reference.safetensors"), tensors,
                     {"transformers_version": transformers.__version__, "pillow_version": PIL.__version__,
                      "numpy_version": np.__version__})
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(dict(
            processor="Qwen2VLImageProcessorPil (transformers' PIL/NumPy image processor), fed the file path",
            transformers_version=transformers.__version__, pillow_version=PIL.__version__,
            configs=config_files,
            cases=listed, refusals=refused, resize_sweep=sweep), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
