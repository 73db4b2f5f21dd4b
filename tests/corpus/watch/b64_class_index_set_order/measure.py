"""Run broken.py / fixed.py on 2 ranks (and fixed.py on 1 rank as a reference), load each rank's
exported model + class list and score every rank's model by label NAME on the same records."""
import importlib.util
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(script, nproc):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RUN_EXPORT_DIR=out)
        subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", script],
                       cwd=HERE, env=env, check=True, timeout=120, capture_output=True)
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(nproc)]
    finally:
        shutil.rmtree(out)


def name_accuracy(mod, ckpt, records):
    model = mod.build_model(len(ckpt["classes"]))
    model.load_state_dict(ckpt["model"])
    with torch.no_grad():
        pred = model(torch.stack([r["features"] for r in records])).argmax(1)
    return sum(ckpt["classes"][p] == r["label"] for p, r in zip(pred.tolist(), records)) / len(records)


def main():
    mod = load("fixed")
    records = mod.load_records()
    for script, nproc in [("fixed.py", 1), ("fixed.py", 2), ("broken.py", 2)]:
        ck = run(script, nproc)
        same_map = all(c["classes"] == ck[0]["classes"] for c in ck)
        pdiff = max((c["model"][k] - ck[0]["model"][k]).abs().max().item()
                    for c in ck for k in c["model"])
        accs = [name_accuracy(mod, c, records) for c in ck]
        mism = 0
        if nproc == 2:
            m0, m1 = ({n: i for i, n in enumerate(c["classes"])} for c in ck)
            mism = sum(m0[n] != m1[n] for n in m0)
        print(f"{script} nproc={nproc}: same class order on all ranks={same_map} "
              f"labels indexed differently={mism}/8 max param diff across ranks={pdiff:.1e} "
              f"accuracy by name per rank={[round(a, 3) for a in accs]}")
        if nproc == 2:
            print(f"   rank0 classes {ck[0]['classes']}\n   rank1 classes {ck[1]['classes']}")


if __name__ == "__main__":
    main()
