"""/metrics of the main server of test_openai_server.py: qatserve's families read by prometheus_client's parser with
their types, labels and histograms, the request log, and vLLM's families for routers from the same measurements."""
import http.client
import json

from server_harness import HANG_STOP, sample_values, wait_for


class MetricsChecks:
    """The checks of /metrics and the request log.

    Mixed into test_openai_server.Suite, which sets self.binary, self.model (the synthesized checkpoint),
    self.workdir, self.a (the main server) and self.client (the openai client on it).
    """

    def metrics_exposition(self):
        # prometheus_client's parser reads the whole body (it raises on anything malformed); every family has its
        # type and help, the labels it should, and histograms whose buckets are cumulative and end at +Inf = count.
        # (vLLM's names for the same measurements: vllm_metrics.)
        families = {n: f for n, f in self.a.metric_families().items() if n.startswith("qatserve_")}
        counters = ["qatserve_requests", "qatserve_prompt_tokens", "qatserve_generation_tokens",
                    "qatserve_prefix_cache_hit_tokens", "qatserve_prefix_cache_query_tokens",
                    "qatserve_prefix_cache_tier_hit_tokens", "qatserve_preemptions",
                    "qatserve_engine_steps", "qatserve_http_connections_refused", "qatserve_http_timeouts",
                    "qatserve_media_encode", "qatserve_media_cache_hits",
                    "qatserve_spec_decode_drafts", "qatserve_spec_decode_draft_tokens",
                    "qatserve_spec_decode_accepted_tokens"]
        histograms = ["qatserve_time_to_first_token_seconds", "qatserve_time_per_output_token_seconds",
                      "qatserve_inter_token_latency_seconds", "qatserve_e2e_request_latency_seconds"]
        gauges = ["qatserve_ready", "qatserve_requests_running", "qatserve_requests_waiting",
                  "qatserve_kv_cache_used_tokens", "qatserve_kv_cache_total_tokens", "qatserve_kv_cache_used_bytes",
                  "qatserve_kv_cache_total_bytes", "qatserve_kv_cache_blocks_used", "qatserve_kv_cache_blocks_total",
                  "qatserve_kv_cache_info", "qatserve_resident_memory_bytes", "qatserve_planned_resident_bytes", "qatserve_weight_bytes",
                  "qatserve_http_connections", "qatserve_spec_decode_acceptance_rate"]
        expected = {**{n: "counter" for n in counters}, **{n: "histogram" for n in histograms},
                    **{n: "gauge" for n in gauges}}
        assert {n: f.type for n, f in families.items()} == expected, {n: f.type for n, f in families.items()}
        for name, f in families.items():
            assert f.documentation, f"{name} has no HELP"
            for sample in f.samples:
                assert sample.value >= 0 and sample.timestamp is None, (name, sample)
                if f.type == "counter":
                    assert sample.name == name + "_total", sample
        outcomes = {s.labels["outcome"] for s in families["qatserve_requests"].samples}
        assert outcomes == {"stop", "length", "abort", "error", "rejected"}, outcomes
        assert [s.labels for s in families["qatserve_weight_bytes"].samples] == [{"device": "cpu"}]
        assert [s.labels for s in families["qatserve_kv_cache_info"].samples] == [{"dtype": "bf16"}]
        tiers = [s.labels for s in families["qatserve_prefix_cache_tier_hit_tokens"].samples]
        assert tiers == [{"tier": "ram"}, {"tier": "disk"}], tiers
        unlabelled = set(families) - {"qatserve_requests", "qatserve_weight_bytes", "qatserve_kv_cache_info",
                                      "qatserve_prefix_cache_tier_hit_tokens", *histograms}
        for name in unlabelled:
            assert [s.labels for s in families[name].samples] == [{}], (name, families[name].samples)
        for name in histograms:
            samples = families[name].samples
            buckets = [s for s in samples if s.name == name + "_bucket"]
            assert all(set(s.labels) == {"le"} for s in buckets), buckets
            bounds = [float(s.labels["le"]) for s in buckets]
            counts = [s.value for s in buckets]
            assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), (name, bounds)
            assert bounds[-1] == float("inf"), (name, bounds)
            assert counts == sorted(counts), (name, counts)
            total = {s.name: s.value for s in samples if s.name != name + "_bucket"}
            assert set(total) == {name + "_sum", name + "_count"}, total
            assert counts[-1] == total[name + "_count"] > 0, (name, counts[-1], total)
        m = self.a.metrics()
        assert m['qatserve_requests_total{outcome="length"}'] > 0 and m['qatserve_requests_total{outcome="rejected"}'] > 0
        assert m["qatserve_prompt_tokens_total"] > 0 and m["qatserve_generation_tokens_total"] > 0
        assert m['qatserve_weight_bytes{device="cpu"}'] > 0 and m["qatserve_resident_memory_bytes"] > 1e6
        assert m["qatserve_kv_cache_total_tokens"] > 0 and m["qatserve_ready"] == 1
        assert 0 <= m["qatserve_kv_cache_blocks_used"] <= m["qatserve_kv_cache_blocks_total"] > 0
        # One log line per request with its numbers.
        lines = [l for l in self.a.log_text().splitlines() if " prompt=" in l and " outcome=" in l]
        assert len(lines) > 20 and all("ttft=" in l and "tok/s" in l for l in lines), lines[:3]

    def vllm_metrics(self):
        """/metrics has vLLM's families with vLLM's types and labels, from the same measurements as ours; KV usage
        is a fraction, read while a stream holds KV."""
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 8  # several complete KV blocks
        for _ in range(2):  # the second adopts the first's blocks from the prefix cache
            self.client.completions.create(model="tiny-e2b", prompt=long_prompt, max_tokens=2, temperature=0)
        conn = http.client.HTTPConnection("127.0.0.1", self.a.port, timeout=HANG_STOP)
        conn.request("POST", "/v1/completions", body=json.dumps({
            "prompt": "Tell me a long story about the sea", "max_tokens": 3000, "ignore_eos": True, "stream": True}),
            headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.readline().startswith(b"data: ")  # the stream is running: it holds KV blocks
        labels = '{model_name="tiny-e2b",engine="0"}'
        # The engine updates its KV gauges at the end of a step, after handing out the step's tokens.
        during = wait_for(lambda: (m := self.a.metrics())["vllm:kv_cache_usage_perc" + labels] > 0 and m,
                          "KV usage counted while the stream runs")
        conn.close()
        assert during["vllm:num_requests_running" + labels] >= 1, during
        assert 0 < during["vllm:kv_cache_usage_perc" + labels] <= 1, during

        families = self.a.metric_families()
        expected = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
                    "vllm:kv_cache_usage_perc": "gauge", "vllm:prefix_cache_hits": "counter",
                    "vllm:prefix_cache_queries": "counter", "vllm:num_preemptions": "counter",
                    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
                    "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
                    "vllm:inter_token_latency_seconds": "histogram",
                    "vllm:time_per_output_token_seconds": "histogram",
                    "vllm:request_time_per_output_token_seconds": "histogram",
                    "vllm:e2e_request_latency_seconds": "histogram", "vllm:spec_decode_num_drafts": "counter",
                    "vllm:spec_decode_num_draft_tokens": "counter", "vllm:spec_decode_num_accepted_tokens": "counter"}
        for name, kind in expected.items():
            assert name in families, f"{name} missing"
            assert families[name].type == kind, (name, families[name].type)
            for sample in families[name].samples:
                assert sample.labels["model_name"] == "tiny-e2b" and sample.labels["engine"] == "0", sample
        assert "vllm:lora_requests_info" not in families, "written without LoRA serving"  # as vLLM without --enable-lora
        cache = families["vllm:cache_config_info"].samples
        assert [s.value for s in cache] == [1] and cache[0].labels["engine"] == "0", cache
        assert cache[0].labels["cache_dtype"] == "bfloat16" and cache[0].labels["block_size"] == "16", cache
        # Every value below from that one scrape (the stream closed above may end between two).
        m = sample_values(families)
        usage = m["vllm:kv_cache_usage_perc" + labels]
        assert 0 <= usage <= 1, usage
        success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples
                   if s.name == "vllm:request_success_total"}
        for reason in ("stop", "length", "abort"):
            assert success[reason] == m[f'qatserve_requests_total{{outcome="{reason}"}}'], (reason, success, m)
        assert "rejected" not in success
        hits, queries = m["vllm:prefix_cache_hits_total" + labels], m["vllm:prefix_cache_queries_total" + labels]
        assert 0 < hits <= queries, (hits, queries)
        assert hits == m["qatserve_prefix_cache_hit_tokens_total"], (hits, m)
        assert m["vllm:e2e_request_latency_seconds_count" + labels] == m["qatserve_e2e_request_latency_seconds_count"]
        assert m["vllm:inter_token_latency_seconds_count" + labels] > 0
        print(f"  kv usage {usage:.4f} now, {during['vllm:kv_cache_usage_perc' + labels]:.4f} during a stream; "
              f"prefix cache {hits:.0f} of {queries:.0f} tokens hit", flush=True)
