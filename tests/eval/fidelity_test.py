#!/usr/bin/env python3
"""Tests of the fidelity evaluation's parts: the quantizers and byte counts (kv_quant.py), the
policies' budgets (kv_policies.py), the prompt sets (workloads.py), and one short prompt end to end
through fidelity.py on the real model. Run by ctest (fidelity_test, label eval) through
fidelity_test.sh.

Usage: fidelity_test.py MODEL.gguf
"""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_rule  # noqa: E402
import fidelity  # noqa: E402
import kv_policies as kp  # noqa: E402
import kv_quant as kq  # noqa: E402
import smollm_reference as sr  # noqa: E402
import smollm_tokenizer  # noqa: E402
import workloads  # noqa: E402

MODEL = None


class QuantizerTest(unittest.TestCase):
    def setUp(self):
        self.x = np.random.RandomState(7).standard_normal((3, 32, 64)).astype(np.float32) * 4

    def test_int8_error_is_at_most_half_a_step_per_channel(self):
        out = kq.int8_sym(self.x, axis=1)
        step = np.abs(kq.fp16(self.x)).max(axis=1, keepdims=True) / 127
        # half a step, plus the FP16 rounding of the decoded value
        bound = step / 2 + np.abs(out) * 2.0 ** -11
        self.assertTrue(np.all(np.abs(out - kq.fp16(self.x)) <= bound * 1.0001))

    def test_int4_error_is_at_most_half_a_step_per_token(self):
        out = kq.int4_asym(self.x, axis=2)
        f = kq.fp16(self.x)
        step = (f.max(axis=2, keepdims=True) - f.min(axis=2, keepdims=True)) / 15
        bound = step / 2 + np.abs(out) * 2.0 ** -11
        self.assertTrue(np.all(np.abs(out - f) <= bound * 1.0001))
        self.assertGreater(float(np.abs(out - f).max()), 0.0)  # it did quantize

    def test_constant_groups_decode_exactly(self):
        x = np.full((2, 8, 4), 1.5, dtype=np.float32)
        np.testing.assert_array_equal(kq.int4_asym(x, axis=1), x)
        np.testing.assert_array_equal(kq.int8_sym(np.zeros_like(x), axis=1), np.zeros_like(x))

    def test_v2_bytes_count_every_section(self):
        p = np.full((2, 3, 32), kq.FULL, dtype=np.uint8)
        map_bytes = (2 * 3 * 32 * 2 + 7) // 8
        self.assertEqual(kq.v2_block_bytes(p, 64), 48 + map_bytes + 6 * 2 * 32 * 64 * 2)
        p[:] = kq.INT8
        group = 2 * (32 * 64) + 64 * 2 + 32 * 2  # K and V codes, K ranges, V ranges
        self.assertEqual(kq.v2_block_bytes(p, 64), 48 + map_bytes + 6 * group)
        p[:] = kq.INT4
        group = 2 * (32 * 32) + 64 * 4 + 32 * 4
        self.assertEqual(kq.v2_block_bytes(p, 64), 48 + map_bytes + 6 * group)
        p[:] = kq.PRUNED
        self.assertEqual(kq.v2_block_bytes(p, 64), 48 + map_bytes)

    def test_v1_bytes_match_the_daemon_replica(self):
        layout = daemon_rule.Layout(2, 3, 64, 16)
        rng = np.random.RandomState(5)
        for _ in range(20):
            p = rng.randint(0, 3, 16).astype(np.uint8)
            self.assertEqual(kq.v1_block_bytes(p, 2, 3, 64),
                             daemon_rule.compressed_size(layout, p))


def _random_cache(layout, n, seed=3):
    rng = np.random.RandomState(seed)
    shape = (layout.kv_heads, n, layout.head_dim)
    cache = sr.KvCache(k=[rng.standard_normal(shape).astype(np.float32)
                          for _ in range(layout.layers)],
                       v=[rng.standard_normal(shape).astype(np.float32)
                          for _ in range(layout.layers)],
                       positions=np.arange(n))
    attention = [rng.rand(layout.kv_heads, n).astype(np.float32) for _ in range(layout.layers)]
    return cache, kp.Signals(attention, attention, 32)


class PolicyBudgetTest(unittest.TestCase):
    layout = kp.Layout(layers=4, kv_heads=3, head_dim=64, block_tokens=32)

    def test_every_policy_stays_within_its_budget(self):
        n = 256
        cache, signals = _random_cache(self.layout, n)
        fp16_bytes = self.layout.fp16_bytes(n)
        for budget in (0.5, 0.37, 0.25, 0.15):
            for name, fn in (("streaming", lambda: kp.streaming_llm(cache, self.layout, budget)),
                             ("h2o", lambda: kp.h2o(cache, self.layout, budget, signals)),
                             ("snapkv", lambda: kp.snapkv(cache, self.layout, budget, signals)),
                             ("ours", lambda: kp.ours(cache, self.layout, budget, signals))):
                served = fn()
                self.assertLessEqual(served.bytes, budget * fp16_bytes, f"{name} at {budget}")
                self.assertGreater(served.bytes, 0.9 * budget * fp16_bytes, f"{name} {budget}")

    def test_quantize_first_prunes_only_when_int4_does_not_fit(self):
        n = 256
        cache, signals = _random_cache(self.layout, n)
        scores = kp.importance_scores(cache, signals, kp.Protection(), (0.6, 0.3, 0.1))
        protected = np.arange(n) < 4
        full = self.layout.fp16_bytes(n)
        p37, _ = kp.allocate(self.layout, scores, protected, 0.37 * full)
        self.assertFalse(np.any(p37 == kq.PRUNED))  # INT8 and INT4 fit in 37%
        self.assertTrue(np.any(p37 == kq.INT4) and np.any(p37 == kq.INT8))
        # the INT8 entries are the most important of the unprotected ones
        free = ~np.broadcast_to(protected, scores.shape)
        self.assertGreaterEqual(scores[(p37 == kq.INT8) & free].min(),
                                scores[p37 == kq.INT4].max())
        p15, _ = kp.allocate(self.layout, scores, protected, 0.15 * full)
        self.assertTrue(np.any(p15 == kq.PRUNED))
        self.assertFalse(np.any(p15 == kq.INT8))  # everything INT4 before anything is pruned
        self.assertTrue(np.all(p15[:, :, :4] == kq.FULL))

    def test_masked_entries_are_hidden_from_their_head_only(self):
        cache, signals = _random_cache(self.layout, 64)
        served = kp.h2o(cache, self.layout, 0.5, signals)
        kept = [m.sum(axis=1) for m in served.cache.mask]
        self.assertTrue(all(np.all(k == kept[0][0]) for k in kept))


class PromptSetTest(unittest.TestCase):
    def test_every_source_of_both_sets_is_here_and_the_sets_are_disjoint(self):
        def build(prompt_set):  # a character per token: every source is long enough
            return workloads.build(lambda t: [0] * len(t), list(workloads.WORKLOADS), 6, 1024,
                                   256, prompt_set)
        main, heldout = build("main"), build("heldout")
        self.assertEqual(len(main), 18)
        self.assertEqual(len(heldout), 18)
        self.assertFalse({p.name for p in main} & {p.name for p in heldout})
        self.assertFalse({c[0] for c in workloads.CHAT} & {c[0] for c in workloads.HELDOUT_CHAT})
        with self.assertRaisesRegex(ValueError, "unknown prompt set 'other'"):
            build("other")


class EndToEndTest(unittest.TestCase):
    def test_one_code_prompt(self):
        model = sr.SmolLM(MODEL)
        tokenizer = smollm_tokenizer.load(MODEL)
        prompt = workloads.build(lambda t: smollm_tokenizer.encode(tokenizer, t), ["code"], 1,
                                 192, 48)[0]
        prompt.continuation_tokens = 48
        c = model.config
        layout = kp.Layout(c.layers, c.kv_heads, c.head_dim, 32)
        table = {k: v for k, v in fidelity.policies(kp.Protection()).items()
                 if k in ("fp16", "int8", "snapkv", "daemon_prune", "ours")}
        records = fidelity.run_prompt(model, layout, prompt, table, [0.5], [], kp.Protection(),
                                      32, lambda s: print(s, flush=True))
        by = {r["policy"]: r for r in records}
        self.assertEqual(set(by), set(table))
        self.assertEqual(by["fp16"]["bytes_fraction"], 1.0)
        self.assertGreaterEqual(by["fp16"]["agreement"], 0.97)  # FP16 rounding only
        self.assertLess(by["fp16"]["attention_error"][0], 1e-3)
        for name in ("snapkv", "daemon_prune", "ours"):
            self.assertLessEqual(by[name]["bytes_fraction"], 0.5, name)
        for r in records:
            self.assertEqual(len(r["attention_error"]), c.layers)
            self.assertTrue(np.isfinite(r["ppl_ratio"]) and 0 < r["agreement"] <= 1)
        # A policy that drops half the KV must move the model: the metrics are not constant.
        self.assertGreater(by["snapkv"]["attention_error"][-1], by["int8"]["attention_error"][-1])


if __name__ == "__main__":
    MODEL = sys.argv.pop(1)
    unittest.main(verbosity=2)
