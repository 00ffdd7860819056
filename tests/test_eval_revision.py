"""`judgetrain eval --model_revision` (and an adapter's recorded base revision): the weights and the tokenizer load at
that revision of a hub id, not at main. A hub cache with two snapshots of one repository (offline, HF_HUB_CACHE) stands
in for the hub."""

import json
import shutil
import sys

from helpers import run

MAIN, PINNED = "a" * 40, "b" * 40
PROBE = """
import json, sys
from judgetrain.cli.eval import build_parser, load_target
for argv in json.loads(sys.argv[1]):
    args = build_parser().parse_args(argv)
    model, tok, base = load_target(args.model, args.adapter, args)
    weight = model.get_input_embeddings().weight
    print(json.dumps({"base": base, "weight_sum": float(weight.double().sum()), "max_length": tok.model_max_length}))
"""


def _hub_cache(tiny_judge, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    repo = tmp_path / "hub" / "models--judgetrain-test--judge"
    for commit, scale, max_length in ((MAIN, 1.0, 1111), (PINNED, 2.0, 2222)):
        snap = repo / "snapshots" / commit
        shutil.copytree(tiny_judge, snap)
        model = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(scale)
        model.save_pretrained(snap)
        config = json.loads((snap / "tokenizer_config.json").read_text())
        (snap / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": max_length}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    return tmp_path / "hub"


def _load(hub, *argvs):
    """What `judgetrain eval`'s loader gives for each command line, in one process."""
    proc = run([sys.executable, "-c", PROBE, json.dumps(argvs)], env={"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"},
               timeout=300)
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(argvs):]]


def test_eval_loads_weights_and_tokenizer_at_model_revision_and_an_adapter_at_its_recorded_one(tiny_judge, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    hub = _hub_cache(tiny_judge, tmp_path)

    # an adapter trained on the pinned revision records it (adapter_config.json "revision"): its base loads there
    base = AutoModelForCausalLM.from_pretrained(hub / "models--judgetrain-test--judge" / "snapshots" / PINNED)
    base.config.name_or_path = "judgetrain-test/judge"
    adapter = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], revision=PINNED))
    adapter.peft_config["default"].base_model_name_or_path = "judgetrain-test/judge"
    adapter.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["revision"] == PINNED
    main, pinned, got = _load(hub, ["--model", "judgetrain-test/judge"],
                              ["--model", "judgetrain-test/judge", "--model_revision", PINNED],
                              ["--model", str(tmp_path / "adapter")])
    assert main["max_length"] == 1111 and pinned["max_length"] == 2222
    assert pinned["weight_sum"] == 2 * main["weight_sum"] != 0
    assert got["base"] == "judgetrain-test/judge" and got["max_length"] == 2222
    assert got["weight_sum"] == pinned["weight_sum"]
