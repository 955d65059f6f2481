"""One `deltacast run` across the emulated WAN (scripts/wan.sh) in one of three modes, paced by a
checkpoint directory, and one JSON line per run; bench/store/run_store_wan.sh calls it (docs/
performance.md, "Object storage across a WAN (issue 34)").

    store_wan.py --mode tree|store|hybrid --round R --work DIR --result FILE [options]

The producer (namespace PREFIX0) follows a directory (trainer.kind watch) that this script fills
with the synthetic trainer's checkpoints (`deltacast synth`): checkpoint s appears (a rename) only
once version s is at every member and the inter-cluster link has gone quiet, so no version queues
behind another; every mode sees the same versions. Members 1-4 carry cluster `east`, 5-8 `west`
(in general: the first half and the second half).

  tree    no store; producer_cluster `trainer` (no member has it): every tree crosses the link
  store   every member its own cluster, all in store.clusters: each downloads every version
  hybrid  store.clusters [east, west]: one gateway per cluster downloads and roots its cluster's tree

Two layouts of the links (--links, scripts/wan.sh): `shared`, both clusters behind ONE link
(PREFIX0's eth0 is the link: tx towards the clusters, rx from them); `split`
(DELTACAST_WAN_CLUSTERS=2), each cluster behind its own link, east and west reaching each other
only through the trainer's switch (the link counters: PREFIXts's ports t1 and t2, tx towards the
cluster, rx from it; boundary_tx/rx_bytes sum both links, per_link has each).

Per version >= 2 the line holds: the producer's step (started_at_unix, payload_bytes,
encode_seconds), when the checkpoint appeared, every member's committed_at_unix, the bytes that
crossed the inter-cluster link(s) (tx: towards the clusters, rx: from them) between the
checkpoint's appearance and the version's arrival everywhere, the bytes radosgw sent for the version's objects
and in all (its access log), and, for store modes, the times in the access log: the publish of
latest.json, each gateway's first GET of the version's manifest and frames.
Standard library only.
"""

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

BEAST = re.compile(r'^(\S+) \S+\s+\d+ beast: \S+ (\S+) - \S+ \[([^\]]+)\] "(\S+) (\S+) [^"]*" (\d+) (\d+) .*'
                   r'latency=([0-9.]+)s')


def log(msg: str) -> None:
    print(f"store_wan: {msg}", flush=True)


def link_bytes(ns: str, dev: str = "eth0") -> tuple:
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev], check=True, capture_output=True,
                         text=True).stdout
    s = json.loads(out)[0]
    s = s.get("stats64") or s["stats"]
    return s["tx"]["bytes"], s["rx"]["bytes"]


def read_env(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v.strip("'\"")
    return out


def ceph_time(text: str) -> float:  # 2026-12-07T00:58:41.619+0000
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def beast_time(text: str) -> float:  # 07/Dec/2026:00:58:40.843 +0000
    return dt.datetime.strptime(text, "%d/%b/%Y:%H:%M:%S.%f %z").timestamp()


def rgw_requests(path: Path, offset: int) -> list:
    """radosgw's access lines after `offset`: {start, done, client, method, path, status, bytes, latency}."""
    out = []
    if not path.exists():
        return out
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            m = BEAST.match(raw.decode("utf-8", "replace").rstrip("\n"))
            if not m:
                continue
            done, client, start, method, url, status, nbytes, latency = m.groups()
            out.append({"done": ceph_time(done), "start": beast_time(start), "client": client, "method": method,
                        "path": url.split("?", 1)[0], "query": url.split("?", 1)[1] if "?" in url else "",
                        "status": int(status), "bytes": int(nbytes), "latency": float(latency)})
    return out


def rate_bits(rate: str) -> float:
    m = re.fullmatch(r"([0-9.]+)([kmg]?)(bit|bps)?", rate.lower())
    if not m:
        return 0.0
    v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return v * 8 if m.group(3) == "bps" else v


class Run:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.n = a.receivers
        self.procs = {}
        self.env = dict(os.environ)
        self.s3 = read_env(Path(a.s3_env)) if a.mode != "tree" else {}
        if self.s3:
            self.env["AWS_ACCESS_KEY_ID"] = self.s3["AWS_ACCESS_KEY_ID"]
            self.env["AWS_SECRET_ACCESS_KEY"] = self.s3["AWS_SECRET_ACCESS_KEY"]
        self.rgw_log = Path(self.s3["S3_DIR"]) / "log" / "client.rgw.deltacast.log" if self.s3 else None
        self.ckpts = sorted(Path(a.checkpoints).glob("step-*.safetensors"))
        if len(self.ckpts) < a.steps + 1:
            sys.exit(f"store_wan: {a.checkpoints} holds {len(self.ckpts)} checkpoints, need {a.steps + 1}")
        self.prefix_store = f"wan-{a.mode}-r{a.round}-{os.getpid()}"

    # --- setup -------------------------------------------------------------------------------
    def ns(self, idx) -> str:
        return f"{self.a.prefix}{idx}"

    def addr(self, idx) -> str:
        return f"10.201.0.{idx + 1}"

    def link_counters(self) -> dict:
        """Per link: (bytes towards the cluster(s), bytes from them). shared: one link, PREFIX0's
        eth0; split: PREFIXts's port tK for cluster K (1 east, 2 west)."""
        if self.a.links == "shared":
            return {"link": link_bytes(self.ns(0))}
        return {name: link_bytes(f"{self.a.prefix}ts", f"t{k}") for k, name in ((1, "east"), (2, "west"))}

    @staticmethod
    def diff(after: dict, before: dict) -> dict:
        per = {k: {"tx": after[k][0] - before[k][0], "rx": after[k][1] - before[k][1]} for k in after}
        return {"tx": sum(x["tx"] for x in per.values()), "rx": sum(x["rx"] for x in per.values()), "per_link": per}

    def total(self) -> tuple:
        c = self.link_counters()
        return sum(x[0] for x in c.values()), sum(x[1] for x in c.values())

    def label(self, r: int) -> str:
        if self.a.mode == "store":
            return f"m{r}"
        return "east" if r <= self.n // 2 else "west"

    def write_config(self) -> Path:
        a = self.a
        secret = self.work / "secret"
        secret.write_text(secrets.token_hex(32) + "\n")
        os.chmod(secret, 0o600)
        (self.work / "watch").mkdir(exist_ok=True)
        lines = [f"producer: tcp://{self.addr(0)}:{a.port}", "transport: tcp", f"secret_file: {secret}",
                 f"topology: {a.topology}", "producer_cluster: trainer", "commit: auto",
                 "timeouts: {connect: 10s, heartbeat: 1s, peer: 30s, refit: 5m, join: 180s, producer_loss: 120s}",
                 f"trainer: {{kind: watch, dir: {self.work / 'watch'}, steps: {a.steps}}}",
                 f"output: {{dir: {self.work / 'out'}}}", "members:"]
        for r in range(1, self.n + 1):
            lines.append(f"  - {{rank: {r - 1}, host: {self.addr(r)}, port: {a.port}, cluster: {self.label(r)}}}")
        if a.mode != "tree":
            clusters = ", ".join(sorted({self.label(r) for r in range(1, self.n + 1)}))
            lines += ["store:", f"  endpoint: {self.s3['S3_ENDPOINT']}",
                      f"  region: {self.s3.get('S3_REGION', 'us-east-1')}",
                      f"  bucket: {self.s3['S3_BUCKET']}", f"  prefix: {self.prefix_store}", f"  poll: {a.poll}",
                      f"  clusters: [{clusters}]"]
        path = self.work / "cluster.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def spawn(self, rank: int, config: Path):
        extra = (["--report", str(self.work / "report.json")] if rank == 0 else
                 ["--summary", str(self.work / f"summary-{rank}.json")])
        argv = ["ip", "netns", "exec", self.ns(rank), "timeout", str(self.a.timeout), self.a.deltacast, "run",
                "--config", str(config), "--rank", str(rank), "--size", str(self.n + 1)] + extra
        logf = open(self.work / f"rank{rank}.log", "wb")
        self.procs[rank] = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env)

    def text(self, rank: int) -> str:
        try:
            return (self.work / f"rank{rank}.log").read_text(errors="replace")
        except OSError:
            return ""

    # --- pacing ------------------------------------------------------------------------------
    def reached_everywhere(self, v: int, rgw_offset: int) -> bool:
        """The mode's own sign that version v is at every member (checked again from the summaries)."""
        if self.a.mode == "tree":
            pat = (r"full checkpoint \(version 1\).*verified by (\d+)/(\d+)" if v == 1 else
                   rf"^step \d+: version {v} .*verified (\d+)/(\d+)")
            m = re.search(pat, self.text(0), re.M)
            return bool(m) and m.group(1) == m.group(2) == str(self.n)
        if self.a.mode == "hybrid":
            gateways = [1, self.n // 2 + 1]
            pat = "joined its tree at version 1" if v == 1 else f"version {v} through the cluster"
            return all(pat in self.text(g) for g in gateways)
        # store: the producer heard every member's acknowledgement (acks/<member>.json, written once
        # it committed the version)
        pat = (r"full checkpoint \(version 1\).*held by (\d+)/(\d+) store clusters" if v == 1 else
               rf"^step \d+: version {v} .*held by (\d+)/(\d+) store clusters")
        m = re.search(pat, self.text(0), re.M)
        return bool(m) and m.group(1) == m.group(2) == str(self.n)

    def wait_quiet(self, deadline: float) -> None:
        """Until the inter-cluster link(s) carry < quiet_bytes per 0.5 s in all (only polls left)."""
        last = self.total()
        while time.time() < deadline:
            time.sleep(0.5)
            now = self.total()
            if (now[0] - last[0]) + (now[1] - last[1]) < self.a.quiet_bytes:
                return
            last = now

    def wait_version(self, v: int, rgw_offset: int, limit: float) -> bool:
        deadline = time.time() + limit
        while time.time() < deadline:
            if self.reached_everywhere(v, rgw_offset):
                self.wait_quiet(deadline)
                return True
            if self.procs[0].poll() is not None and self.procs[0].returncode != 0:
                return False
            time.sleep(0.05)
        return False

    def drop(self, s: int) -> float:
        watch = self.work / "watch"
        tmp = watch / f"ckpt-{s}.safetensors.tmp"
        os.link(self.ckpts[s], tmp)
        t = time.time()
        tmp.rename(watch / f"ckpt-{s}.safetensors")
        return t

    # --- the run -----------------------------------------------------------------------------
    def run(self) -> dict:
        a = self.a
        config = self.write_config()
        rgw_offset = self.rgw_log.stat().st_size if self.rgw_log and self.rgw_log.exists() else 0
        counters = {"start": self.link_counters()}
        windows = {}
        appear = {}
        t0 = time.time()
        ok = True
        try:
            for r in range(1, self.n + 1):
                self.spawn(r, config)
            os.link(self.ckpts[0], self.work / "watch" / "ckpt-0.safetensors")
            appear[1] = time.time()
            before = self.link_counters()
            self.spawn(0, config)
            for v in range(1, a.steps + 2):
                if not self.wait_version(v, rgw_offset, a.bootstrap_limit if v == 1 else a.version_limit):
                    log(f"{a.mode} round {a.round}: version {v} did not reach every member in time")
                    ok = False
                    break
                windows[v] = self.diff(self.link_counters(), before)
                time.sleep(a.settle if v > 1 else a.settle + 1.0)
                if v <= a.steps:
                    before = self.link_counters()
                    appear[v + 1] = self.drop(v)
            rc0 = self.procs[0].wait(timeout=max(1, a.timeout - (time.time() - t0)))
            rcs = {r: p.wait(timeout=max(1, a.timeout - (time.time() - t0))) for r, p in self.procs.items()}
        except subprocess.TimeoutExpired:
            ok = False
            rcs = {r: p.poll() for r, p in self.procs.items()}
        finally:
            for p in self.procs.values():
                if p.poll() is None:
                    p.terminate()
            for p in self.procs.values():
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        counters["end"] = self.link_counters()
        return self.collect(ok, rcs, appear, windows, counters, rgw_offset, time.time() - t0)

    def store_times(self, v, st, reqs, vreqs, gateways, at, forward) -> dict:
        """From radosgw's access log: when version v was published (latest.json written after its
        manifest), and for each gateway the request that first saw it, its manifest and frames GETs."""
        out = {}
        manifest_put = [q for q in vreqs if q["method"] == "PUT" and q["path"].endswith("manifest.json")]
        latest_put = [q for q in reqs if q["method"] == "PUT" and q["path"].endswith("/deltas/latest.json")
                      and manifest_put and q["done"] >= manifest_put[0]["done"]]
        published = latest_put[0]["done"] if latest_put else None
        out["published_at_unix"] = published
        if published is None:
            return out
        per_gw = {}
        for g in gateways:
            ip = self.addr(g)
            mine = [q for q in reqs if q["client"] == ip]
            # The request that found the version: its manifest answered (a gateway polls the next
            # version's manifest), or latest.json naming it (binaries before ec0ab51).
            seen = [q["start"] for q in mine if q["start"] >= published - 0.001 and (
                (q["path"].endswith(f"/v{v:020d}/manifest.json") and str(q["status"]) == "200")
                or q["path"].endswith("/deltas/latest.json"))]
            man = [q["start"] for q in mine if q["path"].endswith(f"/v{v:020d}/manifest.json")]
            fr = [q for q in mine if q["path"].endswith(f"/v{v:020d}/frames")]
            if not fr:  # inline: the manifest GET that found the version brought its frames
                fr = [q for q in mine if q["path"].endswith(f"/v{v:020d}/manifest.json") and str(q["status"]) == "200"
                      and q["start"] >= published - 0.001]
            per_gw[g] = {"poll_seen_at": min(seen) if seen else None, "manifest_get_at": min(man) if man else None,
                         "frames_get_first_at": min(q["start"] for q in fr) if fr else None,
                         "frames_requests": len(fr), "frames_bytes": sum(q["bytes"] for q in fr),
                         "committed_at": at[g], "forward_seconds": forward.get((g, v), 0.0)}
        out["gateways"] = per_gw
        # When each gateway's cluster had the version: its last member's commit (the gateway alone: its own).
        # A gateway stamps its commit when it applied the delta, or (older binaries) after forwarding it.
        for g, x in per_gw.items():
            members = [r for r in at if self.label(r) == self.label(g)]
            x["cluster_done_at"] = max(at[r] for r in members)
            stamped_after_forward = at[g] >= x["cluster_done_at"] - 1e-6 and x["forward_seconds"] > 0
            x["applied_at"] = at[g] - x["forward_seconds"] if stamped_after_forward else at[g]
        last = max(per_gw, key=lambda g: per_gw[g]["cluster_done_at"])
        x = per_gw[last]
        enc = st.get("encode_seconds") or 0.0
        if x["poll_seen_at"] and x["frames_get_first_at"]:
            # The gateway whose cluster had it last: where its time went, in order (sums to total).
            out["breakdown"] = {
                "gateway": last,
                "encode": enc,
                "upload": published - st["started_at_unix"] - enc,
                "wait_for_poll": x["poll_seen_at"] - published,
                "requests_to_frames": x["frames_get_first_at"] - x["poll_seen_at"],
                "download_apply": x["applied_at"] - x["frames_get_first_at"],
                "cluster_forward": x["cluster_done_at"] - x["applied_at"],
                "total": max(at.values()) - st["started_at_unix"]}
        ip = self.addr(last)
        out["timeline_last_gateway"] = [
            [round(q["start"] - published, 4), round(q["done"] - published, 4), q["method"],
             q["path"].rsplit("/", 2)[-2] + "/" + q["path"].rsplit("/", 1)[-1], q["status"], q["bytes"]]
            for q in reqs if q["client"] == ip and published - 1.0 <= q["start"] <= x["cluster_done_at"]]
        return out

    @staticmethod
    def bootstrap_seconds(summaries, appear):
        """Version 1 at every member, from its checkpoint's appearance (before the producer started)."""
        if not all(summaries.values()) or 1 not in appear:
            return None
        return max(s.get("committed_at_unix", {}).get("1", 0) for s in summaries.values()) - appear[1]

    def collect(self, ok, rcs, appear, windows, counters, rgw_offset, wall) -> dict:
        a = self.a
        rep_path = self.work / "report.json"
        report = json.loads(rep_path.read_text()) if rep_path.exists() else None
        summaries = {}
        for r in range(1, self.n + 1):
            p = self.work / f"summary-{r}.json"
            summaries[r] = json.loads(p.read_text()) if p.exists() else None
        reqs = rgw_requests(self.rgw_log, rgw_offset) if self.rgw_log else []
        rate = rate_bits(a.uplink)
        rtt = a.rtt_ms / 1e3
        # shared: how many times the version crosses the one link; split: the most any one link
        # carries towards its cluster (each cluster has its own link, used in parallel).
        if a.links == "shared":
            crossings_ideal = {"tree": 1, "store": self.n, "hybrid": 2}[a.mode]
        else:
            crossings_ideal = {"tree": 1, "store": self.n - self.n // 2, "hybrid": 1}[a.mode]
        # The tree pushes: the data is at the members half a round trip after it leaves (the delegated
        # commit is local to them). The store is pulled: a version of at most store.inline_bytes is
        # in its manifest object, so the poll that finds it brings it; with one poll always in flight
        # that request reaches the store half a round trip after the publish on average (polls leave
        # every RTT + store.poll), and its answer takes half a round trip back: one round trip.
        floor_rtts = {"tree": 0.5, "store": 1.0, "hybrid": 1.0}[a.mode]
        # split, tree: with producer_cluster `trainer` the producer feeds each tree's root in one
        # cluster and the other cluster's entry hangs below a member of the first (tree/topology.cpp:
        # the cluster-level tree; double_binary: tree 0 rooted in east, tree 1 in west), so that
        # part of the version crosses the first cluster's link down, up, then the second's down:
        # half an RTT + half the east<->west RTT. double_binary sends half the chunks down each tree,
        # so each link carries the whole payload towards its cluster (its own tree's half from the
        # producer, the other tree's half from the other cluster) and the forwarded half only
        # starts after one link's round trip: floor = max(P/R + RTT/2, P/(2R) + RTT/2 + RTT_x/2).
        # One tree (binary, chain): P/R + RTT/2 + RTT_x/2.
        rtt_x = (a.rtt_cross_ms or 2 * a.rtt_ms) / 1e3
        split_tree = a.links == "split" and a.mode == "tree"
        gateways = [r for r, s in summaries.items() if s and s.get("gateway")]
        forward = {}  # (gateway, version) -> seconds through its cluster
        for g in gateways:
            for m in re.finditer(r"version (\d+) through the cluster in ([0-9.]+) s", self.text(g)):
                forward[(g, int(m.group(1)))] = float(m.group(2))
        steps = {s["version"]: s for s in (report or {}).get("steps", []) if "version" in s}
        versions = []
        for v in range(2, a.steps + 2):
            st = steps.get(v)
            at = {r: (s or {}).get("committed_at_unix", {}).get(str(v)) for r, s in summaries.items()}
            if not st or any(t is None for t in at.values()):
                versions.append({"version": v, "complete": False})
                continue
            payload = st.get("payload_bytes") or st.get("frames_bytes")
            started = st["started_at_unix"]
            last = max(at.values())
            key = f"/v{v:020d}/"
            vreqs = [q for q in reqs if key in q["path"]]
            store_get = sum(q["bytes"] for q in vreqs if q["method"] == "GET")
            win = windows.get(v, {})
            # polls and everything else radosgw sent while this version was current
            w0, w1 = appear.get(v, started), last
            get_all = sum(q["bytes"] for q in reqs if q["method"] == "GET" and w0 <= q["done"] <= w1 + 0.5)
            wire = payload * 8 / rate
            if split_tree and a.topology == "double_binary":
                floor = max(wire + 0.5 * rtt, wire / 2 + 0.5 * rtt + 0.5 * rtt_x)
            elif split_tree:
                floor = wire + 0.5 * rtt + 0.5 * rtt_x
            else:
                floor = crossings_ideal * wire + floor_rtts * rtt
            rec = {"version": v, "complete": True, "payload_bytes": payload, "started_at_unix": started,
                   "appeared_at_unix": appear.get(v), "encode_seconds": st.get("encode_seconds"),
                   "refit_seconds": st.get("refit_seconds"), "changes": st.get("changes"),
                   "elements": st.get("elements"), "committed_at_unix": at,
                   "seconds": last - started, "seconds_from_appeared": last - appear[v] if v in appear else None,
                   "first_member_seconds": min(at.values()) - started,
                   "boundary_tx_bytes": win.get("tx"), "boundary_rx_bytes": win.get("rx"),
                   "per_link": win.get("per_link"),
                   "crossings": win["tx"] / payload if win.get("tx") else None,
                   "store_get_bytes": store_get if self.s3 else None,
                   "store_get_bytes_window": get_all if self.s3 else None,
                   "floor_seconds": floor, "floor_crossings": crossings_ideal, "floor_rtts": floor_rtts,
                   "queued_behind_previous": any(
                       (summaries[r] or {}).get("committed_at_unix", {}).get(str(v - 1), 0) > appear.get(v, 0)
                       for r in summaries)}
            if self.s3:
                rec.update(self.store_times(v, st, reqs, vreqs, gateways, at, forward))
            versions.append(rec)
        line = {"bench": "store_wan", "mode": a.mode, "round": a.round, "receivers": self.n, "links": a.links,
                "rtt_cross_ms": a.rtt_cross_ms if a.links == "split" else None,
                "topology": a.topology if a.mode == "tree" else None, "params": a.params, "uplink": a.uplink,
                "inner": a.inner, "delay_ms": a.delay_ms, "rtt_ms": a.rtt_ms, "poll": a.poll if self.s3 else None,
                "rgw_tcp_nodelay": a.rgw_nodelay if self.s3 else None,
                "steps": a.steps, "ok": ok and report is not None and bool(report.get("ok", False)),
                "rcs": rcs, "wall_seconds": wall, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                "load": open("/proc/loadavg").read().split()[:3],
                "boundary_run_tx_bytes": self.diff(counters["end"], counters["start"])["tx"],
                "boundary_run_rx_bytes": self.diff(counters["end"], counters["start"])["rx"],
                "boundary_run_per_link": self.diff(counters["end"], counters["start"])["per_link"],
                "bootstrap_window": windows.get(1),
                "bootstrap_seconds": self.bootstrap_seconds(summaries, appear),
                "checkpoint_bytes": (report or {}).get("checkpoint_bytes"),
                "producer_store": (report or {}).get("store"),
                "gateway_store": {r: summaries[r].get("store") for r in gateways},
                "deltacast_binary": {"sha256": hashlib.sha256(Path(a.deltacast).read_bytes()).hexdigest()[:16]},
                "bit_exact": bool(report) and all(s and s.get("digest") == report.get("digest") and
                                                  s.get("version") == report.get("version")
                                                  for s in summaries.values()),
                "versions": versions}
        return line


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["tree", "store", "hybrid"], required=True)
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--deltacast", required=True)
    p.add_argument("--checkpoints", required=True, help="a `deltacast synth --out` directory")
    p.add_argument("--s3-env", default="")
    p.add_argument("--prefix", default="dws")
    p.add_argument("--receivers", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--topology", default="double_binary")
    p.add_argument("--port", type=int, default=29870)
    p.add_argument("--poll", default="200ms")
    p.add_argument("--params", default="")
    p.add_argument("--uplink", default="100mbit")
    p.add_argument("--inner", default="1gbit")
    p.add_argument("--delay-ms", type=float, default=25)
    p.add_argument("--rtt-ms", type=float, default=50)
    p.add_argument("--links", choices=["shared", "split"], default="shared",
                   help="scripts/wan.sh's layout: one link for both clusters, or one per cluster")
    p.add_argument("--rtt-cross-ms", type=float, default=0, help="split: RTT between the clusters (east <-> west)")
    p.add_argument("--rgw-nodelay", type=int, default=1, help="recorded: radosgw's beast tcp_nodelay")
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--quiet-bytes", type=int, default=100_000)
    p.add_argument("--bootstrap-limit", type=float, default=200)
    p.add_argument("--version-limit", type=float, default=60)
    p.add_argument("--timeout", type=int, default=400)
    a = p.parse_args()
    line = Run(a).run()
    with open(a.result, "a") as f:
        f.write(json.dumps(line) + "\n")
    vs = [v for v in line["versions"] if v.get("complete")]
    log(f"{a.mode} round {a.round}: ok {line['ok']} bit-exact {line['bit_exact']} in {line['wall_seconds']:.1f} s; "
        + "; ".join(f"v{v['version']} {v['seconds']:.3f} s ({v['seconds'] / v['floor_seconds']:.2f}x floor, "
                    f"{(v['boundary_tx_bytes'] or 0) / v['payload_bytes']:.2f}x payload towards the clusters, "
                    f"{(v['boundary_rx_bytes'] or 0) / v['payload_bytes']:.2f}x from them)" for v in vs))
    if not line["ok"] or not line["bit_exact"] or len(vs) != a.steps:
        sys.exit(1)


if __name__ == "__main__":
    main()
