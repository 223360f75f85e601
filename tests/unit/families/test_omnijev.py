"""omnijev-heads on causal-lm-rows (OmniJev-4B v1.1) on a tiny export in its layout: each option its own
row ending `<|opt|>{option}<|/opt|>`, u / zq / the option text's LM log-probabilities read from it, the
OptionScorer (choice, noul) and the ordinal head (score), the export's calibration; every answer equal
to a plain reference written out here after OmniJev's `mso/head.py` and `MSO1._finish`."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from jev_common.checkpoint_files import ServingError
from jev_worker.serving import build_serving, preflight

from ..family_helpers import ask, assert_probs, copy_without, family_recipe, served

STATE = "The kettle is whistling and steam comes out of its spout."


@pytest.fixture(scope="module")
def omnijev_dir(tmp_path_factory):
    from tools.tiny_family_checkpoints import make_tiny_omnijev

    return make_tiny_omnijev(tmp_path_factory.mktemp("omnijev"), seed=13)


def omnijev_recipe(tiny_recipe):
    """The tiny recipe with the OmniJev recipe's serving and prompt (no system turn, the state right before
    the instructions)."""
    return family_recipe(tiny_recipe, "tiny-omnijev", family="omnijev", system=None, state_block="{state}")


class Reference:
    def __init__(self, folder):
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.t = load_file(str(folder / "heads.safetensors"))
        self.cal = json.loads((folder / "omnijev_export.json").read_text())["calibration"]
        self.open, self.close = self.tok.convert_tokens_to_ids(["<|opt|>", "<|/opt|>"])

    def mlp(self, name, x):
        t = self.t
        return F.linear(
            F.gelu(F.linear(x, t[f"{name}.0.weight"], t[f"{name}.0.bias"])), t[f"{name}.2.weight"], t[f"{name}.2.bias"]
        )

    def lin(self, name, x):
        return F.linear(x, self.t[f"{name}.weight"], self.t[f"{name}.bias"])

    @torch.inference_mode()
    def rows(self, instructions: str, options: list[str]):
        """(u [K, d], zq, feats [K, 6]) from one plain forward per option row."""
        us, zq, sums, counts, firsts = [], None, [], [], []
        for option in options:
            text = (
                self.tok.apply_chat_template(
                    [{"role": "user", "content": STATE + instructions}], tokenize=False, add_generation_prompt=True
                )
                + f"<|opt|>{option}<|/opt|>"
            )
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            o, c = ids.index(self.open), ids.index(self.close)
            h = self.model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            lp = torch.log_softmax(self.model.lm_head(h), -1)
            us.append(h[c])
            zq = h[o - 1] if zq is None else zq
            picked = [float(lp[t - 1, ids[t]]) for t in range(o + 1, c)]
            sums.append(sum(picked))
            counts.append(len(picked))
            firsts.append(float(lp[o - 1, ids[o + 1]]) if picked else 0.0)
        masked = torch.tensor([s if n else -1e4 for s, n in zip(sums, counts)])
        share = (masked - torch.logsumexp(masked, 0)).tolist()
        feats = torch.tensor(
            [
                [s / 10, s / n if n else 0.0, n / 10, sh, f, float(n > 0)]
                for s, n, sh, f in zip(sums, counts, share, firsts)
            ]
        )
        return torch.stack(us), zq, feats

    def option_logits(self, u, zq, type_id, feats):
        g = torch.tanh(self.mlp("head.que", zq))
        h = self.mlp("head.opt", u) * g + self.lin("head.feat", feats)
        tau = torch.exp(self.t["head.log_tau"][type_id])
        logit = (self.lin("head.score", h).squeeze(-1) + self.lin("head.feat_lin", feats).squeeze(-1)) / tau
        return logit, self.lin("head.abstain", g)[0] / tau

    def scale(self, vec, type_):
        w = [max(1e-9, x) ** (1 / self.cal["temperatures"][type_]) for x in vec]
        return [x / sum(w) for x in w]

    def choice(self, instructions, options):
        u, zq, feats = self.rows(instructions, options)
        logit, abstain = self.option_logits(u, zq, 1, feats)
        mu = torch.softmax(torch.cat([logit, abstain[None]]), 0)[:-1].tolist()
        probs = self.scale(mu + [1 - sum(mu)], "choice")[:-1]
        return [p / sum(probs) for p in probs]

    def score(self, instructions, levels):
        u, zq, _ = self.rows(instructions, levels)
        z = self.mlp("ord.z", zq).squeeze(-1)
        raw = self.mlp("ord.cut", u).squeeze(-1)
        theta = [float(raw[0]) + sum(float(F.softplus(r)) for r in raw[1 : i + 1]) for i in range(len(levels))]
        cdf = [1 / (1 + math.exp(-(t - float(z)))) for t in theta[:-1]] + [1.0]
        mu = [max(1e-8, cdf[0])] + [max(1e-8, cdf[i] - cdf[i - 1]) for i in range(1, len(cdf))]
        mu = [m / sum(mu) for m in mu]
        probs = self.scale(mu + [0.0], "score")[:-1]
        return [p / sum(probs) for p in probs]

    def noul(self, instructions):
        u, zq, feats = self.rows(instructions, [""])
        p = 1 / (1 + math.exp(-float(self.option_logits(u, zq, 0, feats)[0][0])))
        p = 1 / (1 + math.exp(-(math.log(p / (1 - p)) + self.cal["noul_bias"])))
        return self.scale([p, 1 - p], "noul")[0]


async def test_omnijev_answers_equal_the_plain_reference(worker_settings, tiny_recipe, omnijev_dir):
    ref = Reference(omnijev_dir)
    settings = worker_settings(recipe=omnijev_recipe(tiny_recipe), model_path=str(omnijev_dir))
    async with served(settings) as (front, worker, _):
        body = await ask(
            front,
            STATE,
            {
                "what": {
                    "type": "choice",
                    "instructions": "What is the kettle doing?",
                    "criteria": {"boiling": "water at 100 C", "cooling": None, "broken": None},
                },
                "level": {
                    "type": "score",
                    "instructions": "How hot is it?",
                    "criteria": ["cold", "warm", "hot", "scalding"],
                },
                "hot": {"type": "noul", "instructions": "The water is hot."},
            },
        )
        answers = body["answers"]
        want = ref.choice("What is the kettle doing?", ["boiling: water at 100 C", "cooling", "broken"])
        assert_probs(answers["what"]["probabilities"], want, ["boiling", "cooling", "broken"])
        assert max(want) - min(want) > 0.05  # the tiny heads tell the options apart
        want = ref.score("How hot is it?", ["cold", "warm", "hot", "scalding"])
        assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2", "3"])
        assert abs(answers["level"]["score"] - sum(i * p for i, p in enumerate(want))) <= 1e-5
        assert abs(answers["hot"]["noul"] - ref.noul("The water is hot.")) <= 1e-5
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["backend"] == "causal-lm-rows" and serving["calibration"]["noul_bias"] == pytest.approx(0.4)
        stats = await (await worker.get("/v1/cache/stats")).json()
        assert "each row runs whole" in stats["prefix_reuse"]


@pytest.mark.parametrize(
    "question, says",
    [
        ({"type": "set", "criteria": {"hot": None, "cold": None}}, "unsupported_question_type"),
        ({"type": "span", "criteria": ["its spout", "The kettle"]}, "unsupported_question_type"),
        ({"type": "choice", "criteria": {"a<|opt|>": None, "b": None}}, "control token"),
    ],
)
async def test_omnijev_refuses_what_it_has_no_head_or_layout_for(
    worker_settings, tiny_recipe, omnijev_dir, question, says
):
    settings = worker_settings(recipe=omnijev_recipe(tiny_recipe), model_path=str(omnijev_dir))
    async with served(settings) as (front, _, _):
        assert says in json.dumps(await ask(front, STATE, {"q": question}, status=422))


# tinnel123666888/OmniJev mso/infer.py @5da4b5c4cd5cc2acb96d18beecbdf5972231ef1b, `MSO1._options`: a choice option is
#     {"text": k if crit[k] in (None, "") else "{}: {}".format(k, crit[k])}
# and a noul question is one option {"text": ""} whatever its criteria; `_prompt` appends each as
# "<|opt|>" + text + "<|/opt|>". What that code writes for these criteria, copied out literally:
UPSTREAM_OPTIONS = {
    "a": "<|opt|>a<|/opt|>",
    "b": "<|opt|>b<|/opt|>",
    "c": "<|opt|>c: water at 100 C<|/opt|>",
    "d": "<|opt|>d: {'unit': 'C', 'max': 100}<|/opt|>",
    "e": "<|opt|>e: ['hot', 'cold']<|/opt|>",
    "f": "<|opt|>f: {'ok': True, 'n': None}<|/opt|>",
}


async def test_omnijev_options_are_written_as_upstream_writes_them(worker_settings, tiny_recipe, omnijev_dir):
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    settings = worker_settings(recipe=omnijev_recipe(tiny_recipe), model_path=str(omnijev_dir))
    async with served(settings) as (front, _, service):
        request = SystemOneRequest.model_validate(
            {
                "model": "jev-latest",
                "state": STATE,
                "questions": {
                    "q": {
                        "type": "choice",
                        "instructions": "Which?",
                        "criteria": {
                            "a": None,
                            "b": "",
                            "c": "water at 100 C",
                            "d": {"unit": "C", "max": 100},
                            "e": ["hot", "cold"],
                            "f": {"ok": True, "n": None},
                        },
                    },
                    "n": {"type": "noul", "instructions": "Hot?", "criteria": {"true": "boiling", "false": "cold"}},
                },
            }
        )
        model = service.model
        rows, _ = rows_for(request.questions, request.state, model.builder, model.readout.kinds)
        assert [row.after for row in rows] == [*UPSTREAM_OPTIONS.values(), "<|opt|><|/opt|>"]
        # noul criteria are not read: the same answer with and without them
        with_criteria = await ask(front, STATE, {"n": request.questions["n"].model_dump(exclude_none=True)})
        without = await ask(front, STATE, {"n": {"type": "noul", "instructions": "Hot?"}})
        assert abs(with_criteria["answers"]["n"]["noul"] - without["answers"]["n"]["noul"]) <= 1e-6


def test_omnijev_needs_its_files_and_backend(tmp_path, tiny_recipe, omnijev_dir):
    with pytest.raises(ServingError, match="needs heads.safetensors"):
        preflight(omnijev_recipe(tiny_recipe), str(copy_without(omnijev_dir, tmp_path, "heads.safetensors")))
    assert build_serving(omnijev_recipe(tiny_recipe), str(omnijev_dir)).backend.name == "causal-lm-rows"
