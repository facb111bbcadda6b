"""Step 5c: least-attained-service within a team's own quota (`Team.las`).

A job that has held few GPU-seconds (`LasParams.below_gpu_s`) may stop jobs of its own team and
priority, of classes the team asked this for, that have held many (`above_gpu_s`) and have, by
estimate, `ratio` times its remaining GPU-time left; it takes their place in the team's quota
(never more than its own size: `victims.find_victims`), so no other team's GPUs or quota are
touched. Victims of a class that checkpoints on the notice lose its save and restart; others must
have saved a checkpoint in this attempt and lose at most `ShareParams.max_lost_s` per GPU. No
ping-pong: a victim has held at least `above_gpu_s` (>= `below_gpu_s`) and attained service only
grows, so it can never stop its preemptor back; like every victim it has run its class's min run
time.
"""

from __future__ import annotations

from trainyard.sched.cycle.state import CycleState
from trainyard.sched.reclaim.victims import in_own_team_place, remaining_s
from trainyard.sched.types import PendingJob, PreemptionKind, RunningJob


class Las:
    name = "las"

    def try_(self, st: CycleState, pj: PendingJob, prio: int) -> bool:
        p, req = st.p, pj.req
        lp = p.las
        team = st.snap.teams.get(req.team)
        if team is None or not team.las_for(req.job_class) or pj.attained_gpu_s >= lp.below_gpu_s:
            return False
        if not st.searches_left():
            return False
        classes = st.snap.classes
        least = lp.ratio * remaining_s(req, pj.progress_s, classes[req.job_class], p) * req.min_gpus
        memo = ("las", req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib, req.where,
                least, st.mask)
        if memo in st.no_share:
            return False
        now, above, max_lost, min_attempt = st.now, lp.above_gpu_s, p.share.max_lost_s, p.share.min_attempt_s
        stopping, pool, lost, on_notice, mine = st.stopping, req.pool, st.lost, st.on_notice, req.team

        def ok(r: RunningJob) -> bool:
            rq = r.req
            if rq.team != mine or rq.id in stopping or rq.pool != pool or not team.las_for(rq.job_class):
                return False
            cls = classes[rq.job_class]
            if cls.priority != prio:
                return False
            g = r.placement.gpus
            ran = now - r.start_time
            if r.attained_gpu_s + g * ran < above:
                return False
            if not on_notice[rq.job_class]:
                # It loses its work since its last checkpoint: only once it has saved one in
                # this attempt, and little since.
                if ran < min_attempt or ran < (rq.checkpoint_interval_s or 0.0) or lost(r) > max_lost * g:
                    return False
            return remaining_s(rq, r.progress_s + ran, cls, p) * g >= least

        return in_own_team_place(st, pj, prio, ok, memo, PreemptionKind.LAS)
