#!/usr/bin/env python3
"""ha-smoke.py PLAN_DIR — turn deploy/k8s/ha's pods into `docker run` lines.

Used by ha-smoke.sh (make k8s-smoke): there is no cluster in CI, so the
workloads of deploy/k8s/ha run as plain containers on one docker network,
from the manifests themselves rather than a copy of them: each container's
args, env (with $(VAR) expansion as the kubelet does it), user, volume
mounts and the DNS names its Services and StatefulSet give it. Secrets and
ConfigMaps the README has the operator create are files in
PLAN_DIR/objects/NAME/KEY (ha-smoke.sh writes them); ConfigMaps of the
install are taken from it.

Prints one JSON object per pod on stdout: name, role (nats, coordinator,
agent), image (as in the manifest), user, groups (fsGroup), read_only, env,
command, args, aliases (network aliases), mounts ([host_dir,
container_path, read_only]; a volume is one host dir shared by the pod's
containers, its files owned and moded as the kubelet does with fsGroup) and
init (the init containers, in order, in the same shape). Standard library
and PyYAML only.
"""

import json
import os
import re
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
NS = "tether"
AGENT_NODES = 2  # DaemonSet pods to run (one per pretend node)


def load(dirname):
    """Every document of the kustomization in dirname, recursively."""
    with open(os.path.join(dirname, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    docs = []
    for r in k["resources"]:
        p = os.path.normpath(os.path.join(dirname, r))
        if os.path.isdir(p):
            docs += load(p)
        else:
            with open(p) as f:
                docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(s, env):
    return VAR.sub(lambda m: env.get(m.group(1), m.group(0)), s)


def main():
    plan = sys.argv[1]
    docs = load(os.path.join(HERE, "ha"))
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    svcs = [d for d in docs if d["kind"] == "Service"]

    def object_file(kind, name, key):
        """A host file holding key of ConfigMap/Secret name."""
        if kind == "configMap" and name in cms:
            d = os.path.join(plan, "install", name)
            os.makedirs(d, exist_ok=True)
            p = os.path.join(d, key)
            with open(p, "w") as f:
                f.write(cms[name]["data"][key])
            os.chmod(p, 0o644)
            return p
        p = os.path.join(plan, "objects", name, key)
        if not os.path.exists(p):
            sys.exit(f"ha-smoke: {kind} {name} key {key} is needed by the manifests; ha-smoke.sh writes none")
        return p

    pods = []
    for d in docs:
        kind = d["kind"]
        if kind not in ("Deployment", "StatefulSet", "DaemonSet"):
            continue
        tmpl = d["spec"]["template"]
        labels = tmpl["metadata"]["labels"]
        spec = tmpl["spec"]
        n = AGENT_NODES if kind == "DaemonSet" else d["spec"]["replicas"]
        for i in range(n):
            pod = f"{d['metadata']['name']}-{i}"
            aliases = []
            if kind == "StatefulSet":
                aliases.append(f"{pod}.{d['spec']['serviceName']}.{NS}.svc")
            for s in svcs:
                sel = s["spec"].get("selector") or {}
                if sel and all(labels.get(k) == v for k, v in sel.items()) and s["spec"].get("clusterIP") != "None":
                    aliases.append(f"{s['metadata']['name']}.{NS}.svc")
            vols = {v["name"]: v for v in spec.get("volumes", [])}
            sc = spec.get("securityContext", {})
            user = sc.get("runAsUser")
            group = sc.get("runAsGroup", user)
            fs_group = sc.get("fsGroup")
            shared = {}  # volume name -> host dir, shared by the pod's containers

            def volume_dir(m):
                """The host dir for mount m, filled like the kubelet does."""
                name = m["name"]
                if name in shared:
                    return shared[name]
                d_host = os.path.join(plan, "mounts", pod, name)
                os.makedirs(d_host, exist_ok=True)
                shared[name] = d_host
                v = vols.get(name)
                if v is None or "emptyDir" in v or "hostPath" in v:
                    # volumeClaimTemplates, emptyDir, hostPath: an empty
                    # directory the pod's user may write (fsGroup).
                    if user is not None:
                        os.chown(d_host, user, fs_group if fs_group is not None else group)
                    os.chmod(d_host, 0o2775 if fs_group is not None else 0o755)
                    return d_host
                k = "secret" if "secret" in v else "configMap"
                src = v[k]
                obj = src.get("secretName") or src.get("name")
                items = src.get("items")
                if items is None:
                    if k == "configMap" and obj in cms:
                        items = [{"key": key, "path": key} for key in cms[obj]["data"]]
                    else:
                        items = [{"key": key, "path": key} for key in sorted(os.listdir(os.path.join(plan, "objects", obj)))]
                for it in items:
                    with open(object_file(k, obj, it["key"]), "rb") as f:
                        data = f.read()
                    p = os.path.join(d_host, it["path"])
                    with open(p, "wb") as f:
                        f.write(data)
                    mode = it.get("mode", src.get("defaultMode", 0o644))
                    if fs_group is not None:
                        # The kubelet's volume ownership: group fsGroup, and
                        # group read on every file of a read-only volume.
                        os.chown(p, 0, fs_group)
                        mode |= 0o440
                    os.chmod(p, mode)
                os.chmod(d_host, 0o755)
                return d_host

            def container(c):
                env = {}
                for e in c.get("env", []):
                    if "value" in e:
                        env[e["name"]] = expand(e["value"], env)
                        continue
                    vf = e["valueFrom"]
                    if "secretKeyRef" in vf:
                        r = vf["secretKeyRef"]
                        with open(object_file("secret", r["name"], r["key"])) as f:
                            env[e["name"]] = f.read().strip()
                    elif "fieldRef" in vf:
                        fp = vf["fieldRef"]["fieldPath"]
                        env[e["name"]] = {"metadata.name": pod, "spec.nodeName": f"node-{i}"}[fp]
                mounts = []
                for m in c.get("volumeMounts", []):
                    mounts.append([volume_dir(m), m["mountPath"], bool(m.get("readOnly"))])
                # A mount inside a read-only bind needs its mount point
                # there already (as the kubelet's volume layout has it).
                for host, path, _ in mounts:
                    for _, inner, _ in mounts:
                        if inner.startswith(path.rstrip("/") + "/"):
                            os.makedirs(os.path.join(host, os.path.relpath(inner, path)), exist_ok=True)
                csc = c.get("securityContext", {})
                image = c["image"]
                role = "nats" if image.split("/")[-1].startswith("nats:") else (
                    "coordinator" if "tether/coordinator" in image else "agent")
                return {
                    "name": pod, "role": role, "image": image,
                    "user": f"{user}:{group}" if user is not None else "",
                    "groups": [fs_group] if fs_group is not None else [],
                    "read_only": bool(csc.get("readOnlyRootFilesystem")),
                    "env": env, "command": [expand(a, env) for a in c.get("command", [])],
                    "args": [expand(a, env) for a in c.get("args", [])],
                    "aliases": aliases, "mounts": mounts,
                }

            main_c = [container(c) for c in spec["containers"]]
            if len(main_c) != 1:
                sys.exit(f"ha-smoke: {pod} has {len(main_c)} containers; only one is run")
            p = main_c[0]
            p["init"] = [container(c) for c in spec.get("initContainers", [])]
            pods.append(p)
    for p in pods:
        print(json.dumps(p))


if __name__ == "__main__":
    main()
