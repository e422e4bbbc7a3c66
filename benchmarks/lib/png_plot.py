"""A dependency-free PNG line plot (zlib + struct only; no matplotlib on the benchmark machines).

plot_loglog(path, series) draws each series [(x, y), ...] as a coloured polyline on log-log axes with a light
grid at every power of two of x and every power of ten of y. There is no text: the caller's report says what
the axes and colours are."""

import math
import struct
import zlib

COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


def _png(path, pixels, width, height):
    raw = b"".join(b"\x00" + bytes(pixels[y * width * 3:(y + 1) * width * 3]) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def plot_loglog(path, series, width=640, height=420, margin=30):
    pts = [p for s in series for p in s]
    x0, x1 = math.log2(min(p[0] for p in pts)), math.log2(max(p[0] for p in pts))
    y0, y1 = math.floor(math.log10(min(p[1] for p in pts))), math.ceil(math.log10(max(p[1] for p in pts)))
    px = bytearray([255]) * (width * height * 3)

    def put(x, y, c, r=0):
        for dx in range(-r, r + 1):
            for dy in range(-r, r + 1):
                if 0 <= x + dx < width and 0 <= y + dy < height:
                    i = ((y + dy) * width + x + dx) * 3
                    px[i:i + 3] = bytes(c)

    def to_px(x, y):
        u = margin + (math.log2(x) - x0) / max(x1 - x0, 1e-9) * (width - 2 * margin)
        w = height - margin - (math.log10(y) - y0) / max(y1 - y0, 1e-9) * (height - 2 * margin)
        return int(round(u)), int(round(w))

    grey = (220, 220, 220)
    for e in range(int(x0), int(x1) + 1):
        u, _ = to_px(2 ** e, 10 ** y0)
        for y in range(margin, height - margin + 1):
            put(u, y, grey)
    for e in range(y0, y1 + 1):
        _, w = to_px(2 ** x0, 10 ** e)
        for x in range(margin, width - margin + 1):
            put(x, w, grey)
    for k, s in enumerate(series):
        c = COLOURS[k % len(COLOURS)]
        for (xa, ya), (xb, yb) in zip(s, s[1:]):
            (ua, wa), (ub, wb) = to_px(xa, ya), to_px(xb, yb)
            n = max(abs(ub - ua), abs(wb - wa), 1)
            for i in range(n + 1):
                put(ua + (ub - ua) * i // n, wa + (wb - wa) * i // n, c, 1)
        for x, y in s:
            put(*to_px(x, y), c, 3)
    _png(path, px, width, height)
