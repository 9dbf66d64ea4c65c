"""Engram n-gram hashing (§4.4.3): hand-computed hashes, continuation, DEAD blocking, rollback, batching, errors."""
import numpy as np
import pytest

from engine.spec.config import load_config
from engine.text.engram_hash import DEAD, NgramHasher

V41 = load_config("configs/deepseek-v4.1-flash.json")
TINY = load_config("configs/tiny-v4.1.json")
# Spec §4.4.2, copied as numbers so the test does not lean on engram_layout.
L1_MULTIPLIERS = [76632096046245, 4839876093313, 35959672319349, 73987337458391]
L14_MULTIPLIERS = [67716810739261, 51510806800915, 30921347202721, 82619226485591]
L1_PRIMES = {2: [16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183],
             3: [16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321],
             4: [16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463]}


def synthetic_map(args, seed=0):
    """A token map with every value below engram_compressed_vocab_size, including the largest one."""
    values = np.random.default_rng(seed).integers(0, args.engram_compressed_vocab_size, size=args.vocab_size)
    values[5] = args.engram_compressed_vocab_size - 1
    return values.astype(np.int64)


def python_rows(tokens, multipliers, primes_by_n, pad):
    """24 row ids of one position from its look-back tokens [c_t, c_t-1, c_t-2, c_t-3] (None = padded)."""
    toks = [pad if c is None else c for c in tokens]
    products = [c * m for c, m in zip(toks, multipliers)]
    out, offset = [], 0
    for n in (2, 3, 4):
        mixed = 0
        for p in products[:n]:
            mixed ^= p
        for prime in primes_by_n[n]:
            out.append(mixed % prime + offset)
            offset += prime
    return out


def random_ids(args, shape, seed):
    return np.random.default_rng(seed).integers(0, args.vocab_size, size=shape)


def test_hand_computed_hashes_for_a_short_sequence():
    token_map = synthetic_map(V41)
    ids = [5, 17, 129279, 42, 7]
    rows = NgramHasher(V41, token_map)(ids, 0)
    assert rows.shape == (1, 5, 2, 24) and rows.dtype == np.int64
    c = [int(token_map[i]) for i in ids]
    pad = int(token_map[2])
    m0, m1, m2, m3 = L1_MULTIPLIERS
    # position 3: every look-back exists
    assert rows[0, 3, 0, 0] == ((c[3] * m0) ^ (c[2] * m1)) % 16000057
    assert rows[0, 3, 0, 8] == ((c[3] * m0) ^ (c[2] * m1) ^ (c[1] * m2)) % 16000189 + sum(L1_PRIMES[2])
    assert rows[0, 3, 0, 23] == (((c[3] * m0) ^ (c[2] * m1) ^ (c[1] * m2) ^ (c[0] * m3)) % 16000463
                                 + sum(L1_PRIMES[2]) + sum(L1_PRIMES[3]) + sum(L1_PRIMES[4][:7]))
    # positions before the start are the pad token's compressed id
    assert rows[0, 0, 0, 0] == ((c[0] * m0) ^ (pad * m1)) % 16000057
    assert rows[0, 1, 0, 9] == (((c[1] * m0) ^ (c[0] * m1) ^ (pad * m2)) % 16000207
                                + sum(L1_PRIMES[2]) + 16000189)
    for t in range(5):
        look = [c[t - s] if t - s >= 0 else None for s in range(4)]
        assert rows[0, t, 0].tolist() == python_rows(look, L1_MULTIPLIERS, L1_PRIMES, pad)
    # layer 14 uses its own multipliers (its primes come from engram_layout, checked against the spec in test_config)
    l14 = {n: list(p) for n, p in zip((2, 3, 4), V41.engram_layout.primes()[1])}
    assert rows[0, 4, 1].tolist() == python_rows(c[4:0:-1], L14_MULTIPLIERS, l14, pad)


def test_tables_come_from_engram_layout():
    hasher = NgramHasher(V41, synthetic_map(V41))
    assert hasher.multipliers.tolist() == V41.engram_layout.multipliers() == [L1_MULTIPLIERS, L14_MULTIPLIERS]
    assert hasher.primes[0].tolist() == [L1_PRIMES[2], L1_PRIMES[3], L1_PRIMES[4]]
    assert hasher.offsets.tolist() == V41.engram_layout.offsets()


@pytest.mark.parametrize("args", [V41, TINY], ids=["v4.1", "tiny"])
def test_row_ids_stay_inside_each_column_table(args):
    hasher = NgramHasher(args, synthetic_map(args))
    ids = random_ids(args, (3, 200), seed=1)
    ids[0, :4] = 5  # the largest compressed id: the biggest products
    rows = hasher(ids, 0)
    sizes = np.array(args.engram_layout.table_sizes())                       # [L, n_columns]
    offsets = np.array(args.engram_layout.offsets())
    assert rows.shape == (3, 200, len(args.engram_layer_ids), args.engram_n_columns)
    assert np.all(rows >= offsets) and np.all(rows < offsets + sizes)
    assert np.all(rows.max(axis=(0, 1, 3)) < np.array(args.engram_num_embeddings))
    assert len(np.unique(rows[..., 0, 0])) > 150  # the hash spreads distinct n-grams over the table


def test_continuation_equals_one_shot():
    token_map = synthetic_map(TINY)
    ids = random_ids(TINY, (2, 40), seed=2)
    mask = np.random.default_rng(3).random((2, 40)) > 0.15
    whole = NgramHasher(TINY, token_map)(ids, 0, mask)
    pieces, hasher, pos = [], NgramHasher(TINY, token_map), 0
    for size in (7, 1, 1, 13, 2, 1, 15):  # prefill chunks, then single-token decode steps
        pieces.append(hasher(ids[:, pos:pos + size], pos, mask[:, pos:pos + size]))
        pos += size
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), whole)
    np.testing.assert_array_equal(hasher.history(1), np.where(mask[1], token_map[ids[1]], DEAD))


def test_dead_positions_block_look_back_cumulatively():
    token_map = synthetic_map(V41)
    ids = [11, 12, 13, 14, 15, 16, 17]
    mask = [True, True, False, True, True, True, True]
    c = [int(token_map[i]) for i in ids]
    pad = int(token_map[2])
    hasher = NgramHasher(V41, token_map)
    rows = hasher(ids[:4], 0, mask[:4])
    rows = np.concatenate([rows, hasher(ids[4:], 4, mask[4:])], axis=1)  # DEAD must persist into later calls

    def expect(look):
        return python_rows(look, L1_MULTIPLIERS, L1_PRIMES, pad)
    assert rows[0, 2, 0].tolist() == expect([None] * 4)                  # the masked token itself: all pad
    assert rows[0, 3, 0].tolist() == expect([c[3], None, None, None])   # blocked at s=1
    assert rows[0, 4, 0].tolist() == expect([c[4], c[3], None, None])   # blocked at s=2 and beyond
    assert rows[0, 5, 0].tolist() == expect([c[5], c[4], c[3], None])   # c[1] is not reached past DEAD
    assert rows[0, 6, 0].tolist() == expect([c[6], c[5], c[4], c[3]])
    assert hasher.history(0)[2] == DEAD


def test_rollback_then_rehash_equals_never_going_further():
    token_map = synthetic_map(TINY)
    prompt, rejected, accepted = (random_ids(TINY, (2, n), seed) for n, seed in ((12, 4), (6, 5), (3, 6)))
    hasher = NgramHasher(TINY, token_map)
    hasher(prompt, 0)
    hasher(rejected, 12)
    hasher.rollback(12)
    assert hasher.length(0) == hasher.length(1) == 12
    after = hasher(accepted, 12)
    reference = NgramHasher(TINY, token_map)
    expected = reference(np.concatenate([prompt, accepted], axis=1), 0)[:, 12:]
    np.testing.assert_array_equal(after, expected)
    np.testing.assert_array_equal(hasher.history(0), reference.history(0))
    # a start_pos inside the history overwrites from there, the same as rollback + call
    again = hasher(accepted[:, :2], 13)
    np.testing.assert_array_equal(again, reference(accepted[:, :2], 13))


def test_rows_at_different_positions():
    token_map = synthetic_map(TINY)
    a, b = random_ids(TINY, (1, 9), 7), random_ids(TINY, (1, 4), 8)
    nxt = random_ids(TINY, (2, 3), 9)
    batched = NgramHasher(TINY, token_map)
    batched(np.concatenate([a[:, :4], b], axis=0), 0)
    batched(np.stack([a[0, 4:], np.zeros(5, np.int64)]), [4, 4])  # row 1 gets 5 tokens it will drop
    batched.rollback([9, 4])                                   # per-row rollback: row 1 drops its padding
    got = batched(nxt, [9, 4])
    for row, seq in ((0, a), (1, b)):
        single = NgramHasher(TINY, token_map)
        want = single(np.concatenate([seq, nxt[row:row + 1]], axis=1), 0)[:, -3:]
        np.testing.assert_array_equal(got[row:row + 1], want)


def test_compressed_ids_for_display_do_not_touch_history():
    token_map = synthetic_map(TINY)
    hasher = NgramHasher(TINY, token_map)
    shown = hasher.compressed_ids([[3, 4, 129264]], [[True, True, False]])
    assert shown.tolist() == [[token_map[3], token_map[4], DEAD]]
    assert hasher.length(0) == 0


def test_real_tokenizer_and_token_map_end_to_end():
    from engine.text.engram_map import lookup
    from engine.text.tokenizer import load_tokenizer

    tok = load_tokenizer()
    token_map = lookup(V41, tok)
    ids = tok.encode("Engram looks back three tokens.")
    rows = NgramHasher(V41, token_map)(ids, 0)
    c0, pad = int(token_map[ids[0]]), int(token_map[2])
    assert rows[0, 0, 0, 0] == ((c0 * L1_MULTIPLIERS[0]) ^ (pad * L1_MULTIPLIERS[1])) % L1_PRIMES[2][0]


def test_clear_errors():
    token_map = synthetic_map(TINY)
    hasher = NgramHasher(TINY, token_map)
    hasher([1, 2, 3], 0)
    with pytest.raises(ValueError, match="start_pos 5 is not within 0..3"):
        hasher([4], 5)
    assert hasher.length(0) == 3  # a refused call changes nothing
    with pytest.raises(ValueError, match="engram_mask has shape"):
        hasher([[4, 5]], 3, [[True]])
    with pytest.raises(ValueError, match="token id 129280 is outside"):
        hasher([129280], 3)
    with pytest.raises(ValueError, match="2 entries for a batch of 1"):
        hasher([4], [3, 3])
    with pytest.raises(ValueError, match="cannot roll row 0 back to position 7"):
        hasher.rollback(7)
    with pytest.raises(ValueError, match="engram_compressed_vocab_size"):
        NgramHasher(TINY, np.full(TINY.vocab_size, TINY.engram_compressed_vocab_size))
    with pytest.raises(ValueError, match="no Engram layers"):
        NgramHasher(load_config("configs/deepseek-v4-flash.json"), token_map)
    with pytest.raises(ValueError, match="must hold integers"):
        hasher([[0.5]], 3)
