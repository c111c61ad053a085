#!/usr/bin/env python3
"""deploy/kubernetes/ and the Containerfile, checked offline.

usage: test_manifests.py QATSERVE_BINARY

Every Kubernetes object is validated against Kubernetes 1.35's OpenAPI schemas by the `kubernetes-validate` package
(strict: an unknown field fails); the Gateway API Inference Extension's InferencePool and the HTTPRoute, which are
CRDs outside those schemas, against the required fields of their v1 APIs. Then what ties the files together: the
Deployment's `serve` flags exist (`qatserve serve --help`), its memory limit and --kv-memory are what
`qatserve plan` gives for the model, the probes hit /health, the API key comes from the Secret, the HPA's metric is
the one the adapter rule makes from a metric qatserve exports, the InferencePool selects the Deployment's pods on its
port. The Containerfile: Debian 12 stages, the runtime stage installs only scripts/runtime-packages.sh's list (which,
run on the built binary, covers every shared library ldd reports), copies only the binary and runs as the uid the
Deployment expects. With podman, `podman build` is not run here (docs/deploy.md, "Container image", says why).
Exit status: 0 all passed, 1 a check failed, 77 skipped (no kubernetes-validate).
"""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cluster_util import ROOT, Checks

try:
    import kubernetes_validate
except ImportError:
    print("manifest test skipped: kubernetes-validate is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(77)

K8S_DIR = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.35.0"
CONTAINER_UID = 10001


def load(name):
    return [d for d in yaml.safe_load_all((K8S_DIR / name).read_text()) if d]


def objects():
    return {(d["kind"], d["metadata"]["name"]): d for f in sorted(K8S_DIR.glob("*.yaml")) for d in load(f.name)}


class Suite(Checks):
    def __init__(self, binary):
        super().__init__()
        self.binary = binary
        self.objs = objects()
        self.deployment = self.objs[("Deployment", "qatserve")]
        self.container = self.deployment["spec"]["template"]["spec"]["containers"][0]
        self.args = dict(a[2:].split("=", 1) for a in self.container["args"][1:])

    def schemas(self):
        checked = []
        for (kind, name), obj in self.objs.items():
            if obj["apiVersion"].startswith(("inference.networking.k8s.io/", "gateway.networking.k8s.io/")):
                continue  # CRDs: below
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise AssertionError(f"{kind}/{name} at {'/'.join(map(str, e.path))}: {e.message}") from None
            checked.append(kind)
        print(f"  valid against Kubernetes {K8S_VERSION}: {', '.join(sorted(checked))}")
        assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "Secret"} <= set(checked)

    def inference_pool(self):
        # inference.networking.k8s.io/v1 InferencePool: spec.selector.matchLabels, spec.targetPorts (exactly one
        # {number}), spec.endpointPickerRef.name (+ port.number, failureMode FailOpen|FailClose), all required.
        pool = self.objs[("InferencePool", "qatserve")]
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1", pool["apiVersion"]
        spec = pool["spec"]
        assert set(spec) <= {"selector", "targetPorts", "endpointPickerRef"}, set(spec)
        assert set(spec["selector"]) == {"matchLabels"}, spec["selector"]
        assert spec["selector"]["matchLabels"].items() <= self.deployment["spec"]["template"]["metadata"]["labels"].items()
        assert len(spec["targetPorts"]) == 1 and set(spec["targetPorts"][0]) == {"number"}, spec["targetPorts"]
        assert spec["targetPorts"][0]["number"] == self.container["ports"][0]["containerPort"] == int(self.args["port"])
        epp = spec["endpointPickerRef"]
        assert set(epp) <= {"group", "kind", "name", "port", "failureMode"} and epp["name"], epp
        assert set(epp["port"]) == {"number"} and 1 <= epp["port"]["number"] <= 65535, epp
        assert epp.get("failureMode", "FailClose") in ("FailOpen", "FailClose"), epp
        route = self.objs[("HTTPRoute", "qatserve")]
        assert route["apiVersion"] == "gateway.networking.k8s.io/v1", route["apiVersion"]
        backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
        assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qatserve"}]

    def deployment_consistency(self):
        help_text = subprocess.run([self.binary, "serve", "--help"], capture_output=True, text=True, check=True).stdout
        assert self.container["args"][0] == "serve", self.container["args"]
        for flag in self.args:
            assert re.search(rf"--{re.escape(flag)}\b", help_text), f"--{flag} is not a `qatserve serve` option"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = self.container[probe]["httpGet"]
            assert get["path"] == "/health" and get["port"] == "http", (probe, get)
        startup = self.container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "less than 5 minutes to load weights"
        grace = self.deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        pre_stop = self.container["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert grace > float(self.args["drain-timeout"]) + pre_stop, (grace, self.args["drain-timeout"], pre_stop)
        # the API key: a file from the Secret's volume
        spec = self.deployment["spec"]["template"]["spec"]
        mount = next(m for m in self.container["volumeMounts"] if m["name"] == "api-key")
        volume = next(v for v in spec["volumes"] if v["name"] == "api-key")
        secret = self.objs[("Secret", volume["secret"]["secretName"])]
        assert self.args["api-key-file"] == f"{mount['mountPath']}/api-key" and "api-key" in secret["stringData"]
        assert spec["securityContext"]["runAsUser"] == CONTAINER_UID and spec["securityContext"]["runAsNonRoot"]
        # the model on a read-only volume
        model_mount = next(m for m in self.container["volumeMounts"] if m["mountPath"] == self.args["model"])
        assert model_mount["readOnly"], model_mount
        # the Service and the PDB select these pods
        labels = self.deployment["spec"]["template"]["metadata"]["labels"]
        assert self.objs[("Service", "qatserve")]["spec"]["selector"].items() <= labels.items()
        assert self.objs[("PodDisruptionBudget", "qatserve")]["spec"]["selector"]["matchLabels"].items() <= labels.items()

    def resources_from_plan(self):
        # The comment in qatserve.yaml names the plan; run it and hold the numbers to it.
        comment = (K8S_DIR / "qatserve.yaml").read_text()
        m = re.search(r"qatserve plan (--preset \S+ --weights \S+ --device (\S+) --context (\d+))", comment)
        assert m, "qatserve.yaml does not name its `qatserve plan` command"
        plan = json.loads(subprocess.run([self.binary, "plan", *m.group(1).split(), "--json"], capture_output=True,
                                         text=True, check=True).stdout)
        limits, requests = self.container["resources"]["limits"], self.container["resources"]["requests"]
        memory = parse_quantity(limits["memory"])
        assert memory == plan["device"]["bytes"] == parse_quantity(requests["memory"]), (limits, plan["device"])
        kv = parse_quantity(self.args["kv-memory"])
        assert kv <= plan["available_for_kv"], (kv, plan["available_for_kv"])
        assert int(self.args["max-model-len"]) == int(m.group(3)) and plan["contexts_that_fit"] >= 1
        assert limits["cpu"] == requests["cpu"] == self.args["threads"], (limits, requests, self.args["threads"])
        print(f"  plan: weights {plan['weights']['total'] / 2**30:.2f} GiB + reserve "
              f"{plan['runtime_reserve']['total'] / 2**30:.2f} GiB, KV available {plan['available_for_kv'] / 2**30:.2f}"
              f" GiB >= --kv-memory {self.args['kv-memory']}; limit {limits['memory']}")

    def autoscaling(self):
        hpa = self.objs[("HorizontalPodAutoscaler", "qatserve")]
        assert hpa["spec"]["scaleTargetRef"]["name"] == self.deployment["metadata"]["name"]
        metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
        rules = yaml.safe_load(self.objs[("ConfigMap", "prometheus-adapter-qatserve")]["data"]["config.yaml"])["rules"]
        rule = next(r for r in rules if r["name"]["as"] == metric)
        series = re.match(r"([a-z_:]+)\{", rule["seriesQuery"]).group(1)
        exported = (ROOT / "src" / "server" / "metrics.cc").read_text()
        assert f'"{series}"' in exported, f"{series} is not a metric qatserve exports"
        assert hpa["spec"]["minReplicas"] >= 2, "one replica: the PodDisruptionBudget could never allow a drain"

    def containerfile(self):
        text = (ROOT / "Containerfile").read_text()
        lines = [l.strip() for l in re.sub(r"\\\n", " ", text).splitlines() if l.strip() and not l.startswith("#")]
        stages, current = [], None
        for line in lines:
            instr, _, rest = line.partition(" ")
            if instr == "FROM":
                current = {"from": rest, "lines": []}
                stages.append(current)
            current["lines"].append((instr, rest))
        assert len(stages) >= 2, "not multi-stage"
        for s in stages:
            assert re.fullmatch(r"(docker\.io/library/)?debian:(12|bookworm)(-slim)?( AS \w+)?", s["from"]), s["from"]
        final = stages[-1]["lines"]
        copies = [rest for instr, rest in final if instr == "COPY"]
        assert copies and all(c.startswith("--from=build ") for c in copies), copies  # nothing of the source tree
        installs = " ".join(rest for instr, rest in final if instr == "RUN")
        assert "runtime-packages.txt apt-get install" in installs and "-dev" not in installs, installs
        user = [rest for instr, rest in final if instr == "USER"]
        assert user and user[-1].split(":")[0] == str(CONTAINER_UID), user
        assert f"--uid {CONTAINER_UID}" in installs
        entry = [rest for instr, rest in final if instr == "ENTRYPOINT"]
        assert entry == ['["/usr/local/bin/qatserve"]'], entry
        build = " ".join(rest for instr, rest in stages[0]["lines"] if instr == "RUN")
        assert "scripts/runtime-packages.sh /out/qatserve > /out/runtime-packages.txt" in build, build
        assert "scripts/install-deps.sh" in build

    def runtime_packages(self):
        # ldd's libraries, each found in a package of scripts/runtime-packages.sh's list (dpkg -L of that package)
        packages = subprocess.run([str(ROOT / "scripts" / "runtime-packages.sh"), self.binary], capture_output=True,
                                  text=True, check=True).stdout.split()
        files = set()
        for p in packages:
            listed = subprocess.run(["dpkg", "-L", p], capture_output=True, text=True, check=True).stdout.split()
            files.update(str(Path(f).resolve()) for f in listed if ".so" in f)
        ldd = subprocess.run(["ldd", self.binary], capture_output=True, text=True, check=True).stdout
        libraries = re.findall(r"=> (/\S+)", ldd)
        missing = [lib for lib in libraries if str(Path(lib).resolve()) not in files]
        print(f"  {len(libraries)} shared libraries from {len(packages)} packages: {' '.join(packages)}")
        assert not missing, f"not in any listed package: {missing}"

    def run(self):
        for name, fn in [
            (f"Kubernetes objects valid against the {K8S_VERSION} schemas (kubernetes-validate, strict)", self.schemas),
            ("InferencePool and HTTPRoute: the v1 APIs' required fields, the Deployment's pods", self.inference_pool),
            ("Deployment: serve flags exist, probes on /health, key from the Secret, non-root, read-only model",
             self.deployment_consistency),
            ("Deployment resources are `qatserve plan`'s", self.resources_from_plan),
            ("HPA on the adapter's queue metric from vllm:num_requests_waiting", self.autoscaling),
            ("Containerfile: Debian 12 stages, non-root, the binary and its runtime packages only", self.containerfile),
            ("scripts/runtime-packages.sh covers every shared library of the binary", self.runtime_packages),
        ]:
            self.check(name, fn)
        print(f"\nmanifest checks: {len(self.passed)} passed, {len(self.failed)} failed")
        return 1 if self.failed else 0


def parse_quantity(q):
    """A Kubernetes memory quantity (12Gi, 512M) or a qatserve size (2G = 2 GiB, as --kv-memory reads it) in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|K|M|G|T)?", str(q))
    assert m, q
    powers = {"K": 1, "M": 2, "G": 3, "T": 4}
    unit = m.group(2) or ""
    return int(m.group(1)) * (1024 ** powers[unit[0]] if unit else 1)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    t0 = time.time()
    rc = Suite(str(Path(sys.argv[1]).resolve())).run()
    print(f"manifest test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
