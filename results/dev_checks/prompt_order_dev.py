"""Dev check: the recalibrated table with its breadth-first prompt order vs the same table with
the paper's distortion order, free-running on the dev split's parallel categories."""
import json, sys, time
sys.path.insert(0, '/work/main')
import anyio, numpy as np
from pask_agent.calibration.measure import TraceMeasurement
from pask_agent.calibration.frontier import Sensitivity
from pask_agent.calibration.table_build import _scaled
from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.pask import PaskPolicy
from pask_agent.eval.bfcl_eval import run_config, summarize, load_split
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.runtime import Runtime

rows = [json.loads(l) for l in open('/work/main/results/calibration/default.checkpoint.jsonl')]
ms = [TraceMeasurement.from_json(r['result']) for r in rows if r['stage'] == 'measure']
pre = Sensitivity.aggregate(ms, 'prefill', len(SPAN_LABELS))
pri = _scaled(pre.upgrade_scores(PayloadCosts.from_dims(24, 2, 64)))
data = json.load(open('/work/main/calibration_data/policies/default.json'))
for i, label in enumerate(SPAN_LABELS):
    for c in range(3):
        data['prefill'][label][c]['priority'] = {'R->L': float(pri[i, c, 0]), 'L->H': float(pri[i, c, 1])}
data['prefill_default'] = data['prefill']['protected_content']
data.pop('checksum', None)
variant = PolicyTable.model_validate(data)
cases = load_split('dev', 20, ('parallel', 'parallel_multiple'))
out = {}
async def main():
    async with Runtime.open('default', config=RuntimeConfig(max_batch=64)) as rt:
        for name, pol in (('pask_distortion', PaskPolicy(variant)),):
            t0 = time.time()
            res = await run_config(rt, cases, pol, 1.0 if name == 'full' else 0.33)
            from dataclasses import replace
            s = summarize([replace(r, policy=name) for r in res])
            out[name] = {'accuracy': s.accuracy, 'overall': s.overall, 'measured_b': s.measured_b,
                         'correct': {r.id: r.correct for r in res}, 'seconds': round(time.time() - t0)}
            print(name, s.overall, s.accuracy, s.measured_b, flush=True)
anyio.run(main)
json.dump(out, open('/work/main/results/dev_checks/prompt_order_dev_distortion.json', 'w'), indent=1)
