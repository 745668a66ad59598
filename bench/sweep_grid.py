"""The shape sweep's grid (bench/sweep.py): the axes, a row's id and bytes, and a deterministic
pairwise subset of the axes' product in which every pair of axis values appears. Plain Python:
listing the grid needs neither torch nor a GPU."""

import dataclasses
import hashlib
import itertools

# Each axis and its values, in id order. Heads are (q heads, k heads); rotary "half" rotates
# head_dim / 2 dimensions and passes the rest through.
AXES = {
    "dtype": ("f32", "f16", "bf16"),
    "heads": ((1, 1), (8, 1), (32, 8), (40, 8), (64, 8), (64, 64), (128, 16)),
    "head_dim": (64, 80, 96, 128, 192, 256),
    "rotary": ("full", "half"),
    "style": ("neox", "gptj"),
    "layout": ("bshd", "sbhd", "thd"),
    "tokens": (1, 16, 64, 256, 4096, 32768),
    "freqs": ("table", "computed"),
}
# Seeds the pairwise generator's tie-breaks. Changing it (or the axes) changes which rows the
# grid holds, and so which rows a baseline can be compared on.
GRID_SEED = 52
# Candidate rows built per grid row; the one covering the most new pairs is kept.
CANDIDATES = 24
# The pairwise rows are built to fit this (Row.device_bytes) wherever a pair allows, so that
# with the default --max-bytes every pair is measured; --full holds rows beyond it.
GRID_MAX_BYTES = 4 << 30
# The shapes of issue 52's same-run race against the peers (4 x 2048 tokens of 64 + 64 heads
# is 2 x 4096 here: the same bytes), in every default grid whatever the pairwise subset holds.
PINNED_IDS = (
    "f16_h64-64_d128_r128_neox_bshd_t8192_table",
    "f16_h64-64_d128_r128_neox_bshd_t8192_computed",
    "bf16_h32-8_d128_r128_neox_bshd_t4096_table",
    "bf16_h32-8_d128_r128_neox_bshd_t32768_table",
    "bf16_h16-16_d64_r64_neox_bshd_t16384_table",
)

ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}
TABLE_ITEMSIZE = 4  # cos/sin tables are f32, half width
INDEX_ITEMSIZE = 8  # position ids are int64
# Up to this many tokens a row is decode: one token per sequence, positions spread over a
# context of DECODE_CONTEXT. Above it, sequences of PREFILL_SEQ tokens from position 0 (one
# sequence of all the tokens where they are no multiple of it).
DECODE_MAX_TOKENS = 256
DECODE_CONTEXT = 8192
PREFILL_SEQ = 4096


@dataclasses.dataclass(frozen=True)
class Row:
    """One plain-RoPE call: q and k rotated in place, position ids (int64) into an f32
    half-width table or frequencies computed in the kernel."""

    dtype: str
    q_heads: int
    k_heads: int
    head_dim: int
    rotary_dim: int
    style: str
    layout: str
    tokens: int
    freqs: str

    @property
    def id(self):
        return (f"{self.dtype}_h{self.q_heads}-{self.k_heads}_d{self.head_dim}_r{self.rotary_dim}"
                f"_{self.style}_{self.layout}_t{self.tokens}_{self.freqs}")

    @property
    def seq(self):
        """Tokens per sequence (thd packs the same sequences)."""
        if self.tokens <= DECODE_MAX_TOKENS:
            return 1
        return PREFILL_SEQ if self.tokens % PREFILL_SEQ == 0 else self.tokens

    @property
    def batch(self):
        return self.tokens // self.seq

    @property
    def table_rows(self):
        return max(DECODE_CONTEXT, self.seq)

    @property
    def qk_bytes(self):
        """q and k, whole heads."""
        heads = self.q_heads + self.k_heads
        return self.tokens * heads * self.head_dim * ITEMSIZE[self.dtype]

    @property
    def bytes_moved(self):
        """What the call must move, as the tuner's Workload::bytes_moved counts it: the rotary
        part of q and k read and written (in place, the rest is not touched), and the cos/sin
        entries and position id each token reads."""
        heads = self.q_heads + self.k_heads
        moved = self.tokens * heads * 2 * self.rotary_dim * ITEMSIZE[self.dtype]
        if self.freqs == "table":
            moved += self.tokens * self.rotary_dim * TABLE_ITEMSIZE
        return moved + self.tokens * INDEX_ITEMSIZE

    @property
    def device_bytes(self):
        """What measuring the row allocates: q and k twice (the originals the check and the
        peers start from, and the working copy), the copy's source and destination, the tables
        in f32 and float64, and the position ids; with partial rotary the scratch q and k of the
        access pattern's copy."""
        tables = 2 * self.table_rows * (self.rotary_dim // 2) * (TABLE_ITEMSIZE + 8)
        scratch = self.qk_bytes if self.rotary_dim < self.head_dim else 0
        return (2 * self.qk_bytes + scratch + self.bytes_moved + tables
                + self.tokens * INDEX_ITEMSIZE)

    def axes(self):
        return {"dtype": self.dtype, "q_heads": self.q_heads, "k_heads": self.k_heads,
                "head_dim": self.head_dim, "rotary_dim": self.rotary_dim, "style": self.style,
                "layout": self.layout, "tokens": self.tokens, "freqs": self.freqs,
                "batch": self.batch, "seq": self.seq}

    @classmethod
    def from_axes(cls, axes):
        return cls(**{f.name: axes[f.name] for f in dataclasses.fields(cls)})


def row_from_values(values):
    """A Row from one value per axis, in AXES order."""
    v = dict(zip(AXES, values))
    q_heads, k_heads = v["heads"]
    rotary = v["head_dim"] if v["rotary"] == "full" else v["head_dim"] // 2
    return Row(v["dtype"], q_heads, k_heads, v["head_dim"], rotary, v["style"], v["layout"],
               v["tokens"], v["freqs"])


def row_from_id(row_id):
    """The Row an id names (the inverse of Row.id)."""
    dtype, heads, d, r, style, layout, t, freqs = row_id.split("_")
    q_heads, k_heads = heads[1:].split("-")
    return Row(dtype, int(q_heads), int(k_heads), int(d[1:]), int(r[1:]), style, layout,
               int(t[1:]), freqs)


def _tiebreak(*parts):
    """A number fixed by its arguments alone, on every machine and Python version."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


def all_pairs(sizes):
    """Every (axis a, value i, axis b, value j) with a < b, values as indices."""
    return {(a, i, b, j) for a, b in itertools.combinations(range(len(sizes)), 2)
            for i in range(sizes[a]) for j in range(sizes[b])}


def pairs_of(row):
    return {(a, row[a], b, row[b]) for a, b in itertools.combinations(range(len(row)), 2)}


def _best_start(uncovered, seed, row_no):
    """The (axis, value) in the most uncovered pairs."""
    counts = {}
    for a, i, b, j in uncovered:
        counts[(a, i)] = counts.get((a, i), 0) + 1
        counts[(b, j)] = counts.get((b, j), 0) + 1
    return max(counts, key=lambda av: (counts[av], _tiebreak(seed, row_no, "start", av)))


def _candidate(uncovered, sizes, seed, row_no, c, fits):
    """One row: the best start, then each other axis (in an order drawn for this candidate)
    set to the value completing the most uncovered pairs with the values already set, among
    the values with which the row can still fit."""
    start_axis, start_value = _best_start(uncovered, seed, row_no)
    row = [None] * len(sizes)
    row[start_axis] = start_value
    order = sorted((a for a in range(len(sizes)) if a != start_axis),
                   key=lambda a: _tiebreak(seed, row_no, c, "axis", a))
    for a in order:
        def score(i):
            gain = sum(((b, row[b], a, i) if b < a else (a, i, b, row[b])) in uncovered
                       for b in range(len(sizes)) if row[b] is not None)
            return fits(row[:a] + [i] + row[a + 1:]), gain, _tiebreak(seed, row_no, c, a, i)
        row[a] = max(range(sizes[a]), key=score)
    return tuple(row)


def pairwise_indices(sizes, seed=GRID_SEED, candidates=CANDIDATES, fits=lambda row: True):
    """Rows (tuples of value indices) in which every pair of values of two axes appears,
    built greedily: each row is the candidate covering the most pairs not yet covered.
    fits(row), row with None for axes not yet set, says whether the row can still be
    completed within a limit (a pair that fits in no row gets a row anyway)."""
    uncovered = all_pairs(sizes)
    rows = []
    while uncovered:
        best = max((_candidate(uncovered, sizes, seed, len(rows), c, fits)
                    for c in range(candidates)),
                   key=lambda row: (fits(list(row)), len(pairs_of(row) & uncovered)))
        if not pairs_of(best) & uncovered:  # the pairs left fit in no row: cover them anyway
            best = _candidate(uncovered, sizes, seed, len(rows), 0, lambda row: True)
        rows.append(best)
        uncovered -= pairs_of(best)
    return rows


def fits_within(values, limit):
    """fits(row) for pairwise_indices: the row's device bytes with every axis not yet set at
    its cheapest value (each axis's cheapest value is the same whatever the others are)."""
    def cost(axis, i):
        indices = [0] * len(values)
        indices[axis] = i
        return _device_bytes(values, indices)

    cheapest = [min(range(len(vals)), key=lambda i: cost(a, i)) for a, vals in enumerate(values)]

    def fits(row):
        indices = [c if i is None else i for i, c in zip(row, cheapest)]
        return _device_bytes(values, indices) <= limit
    return fits


def _device_bytes(values, indices):
    return row_from_values([vals[i] for vals, i in zip(values, indices)]).device_bytes


def grid(axes=None, full=False, pinned=True, seed=GRID_SEED):
    """The sweep's rows: the pairwise subset (or with full, the whole product) of `axes` (name
    -> values, default AXES), then the pinned rows not already in it."""
    axes = AXES if axes is None else axes
    values = [axes[name] for name in AXES]
    if full:
        rows = [row_from_values(v) for v in itertools.product(*values)]
    else:
        fits = fits_within(values, GRID_MAX_BYTES)
        rows = [row_from_values([vals[i] for vals, i in zip(values, idx)])
                for idx in pairwise_indices([len(v) for v in values], seed, fits=fits)]
    seen = {r.id for r in rows}
    extra = [row_from_id(i) for i in PINNED_IDS if i not in seen] if pinned else []
    return rows + extra
