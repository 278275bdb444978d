"""The point-maze stitching dataset, `offrl/pointmaze/umaze-stitch-v0` (MBRCSL's point-maze data,
Zhou et al. ICLR 2024; docs/FACTS.md section 8), made by a scripted waypoint controller in
`offrl/PointMazeStitch-v0` (offrl.envs).

Four groups of `episodes_per_group` episodes of 200 steps, all from the start cell S = (1, 2):

    groups 1, 2  S -> M = (2, 2), then keep steering to M          (short, ends away from the goal)
    group 3      S -> (1, 1) -> (2, 1) -> G = (2, 4), then hold at G   (the long detour)
    group 4      the same detour, then uniform random actions

The best route, S -> M -> (2, 3) -> G, is never driven whole: a policy has to stitch the first part
of the short episodes to the second part of the detour to beat the data's best return.

The controller (D4RL's waypoint controller, as the reference uses it): cells along the shortest grid
path to the next route cell are waypoints; action = clip(10 (target - position) - velocity, -1, 1);
an intermediate waypoint's target is its cell centre minus U(0, 1) * 0.2 per axis and counts as passed
within 0.1; a route cell counts as reached within 0.5 at |v| <= 0.5 per axis (any speed for group 4's
last cell). Episode i resets with seed `seed + i`; the controller's draws come from
`numpy.random.default_rng(seed)`, so the data is the same on every run.

Reference scores: ref_min = uniform random actions, ref_max = the same controller driving the best
route S -> M -> G and holding there; 100 episodes each, reset seeds 123, 124, ...

Differences from the reference data (`pointmaze.dat`): all 200 transitions of an episode are kept
(the reference drops the last one), resets are seeded `seed + i` instead of a random seed in
[0, 1000), and the controller's route-cell targets are the cells' centres, where the reference's
sampler jitters each by +-0.25 (`cell2xy`'s noise), so its detouring groups reach, and one holds at, a
jittered point near the goal rather than the goal cell's centre (their mean return a little lower there;
the best return, which sets MBRCSL's threshold, about the same).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from offrl.data.suite import Episode, MadeDataset

STITCH_ID = "offrl/pointmaze/umaze-stitch-v0"
GROUPS = ((((2, 2),), "hold"), (((2, 2),), "hold"), (((1, 1), (2, 1), (2, 4)), "hold"),
          (((1, 1), (2, 1), (2, 4)), "random"))
BEST_ROUTE = ((2, 2), (2, 4))
GAIN, DAMPING = 10.0, 1.0
WAYPOINT_RADIUS, GOAL_RADIUS, GOAL_SPEED = 0.1, 0.5, 0.5
REF_SEED, REF_EPISODES = 123, 100


def grid_path(walls: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[tuple[int, int]]:
    """The cells after `start` on a shortest 4-connected path to `goal` (breadth-first search)."""
    previous = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nxt = (cell[0] + dr, cell[1] + dc)
            if (0 <= nxt[0] < walls.shape[0] and 0 <= nxt[1] < walls.shape[1] and not walls[nxt]
                    and nxt not in previous):
                previous[nxt] = cell
                queue.append(nxt)
    if goal not in previous:
        raise ValueError(f"no path from {start} to {goal}")
    path, cell = [], goal
    while cell != start:
        path.append(cell)
        cell = previous[cell]
    return path[::-1]


class WaypointController:
    """Drives the ball along `route` (cells), then holds at the last one ('hold') or acts uniformly at
    random ('random')."""

    def __init__(self, maze, walls: np.ndarray, route, after: str, rng: np.random.Generator):
        self.maze, self.walls, self.after, self.rng = maze, walls, after, rng
        self.route = [tuple(c) for c in route]
        self.waypoints: list[tuple[tuple[int, int], bool]] = []  # (cell, is a route cell)
        self.target: np.ndarray | None = None
        self.done = False

    def start(self, position: np.ndarray) -> None:
        cell = tuple(int(v) for v in self.maze.cell_xy_to_rowcol(position))
        for route_cell in self.route:
            path = grid_path(self.walls, cell, route_cell)
            self.waypoints += [(c, c == route_cell) for c in path]
            cell = route_cell
        self._next_target()

    def _next_target(self) -> None:
        cell, is_route_cell = self.waypoints[0]
        centre = self.maze.cell_rowcol_to_xy(np.asarray(cell))
        self.target = centre if is_route_cell else centre - self.rng.uniform(0.0, 1.0, size=2) * 0.2

    def __call__(self, obs: np.ndarray, action_space) -> np.ndarray:
        position, velocity = obs[:2], obs[2:4]
        if not self.done:
            cell, is_route_cell = self.waypoints[0]
            distance = np.linalg.norm(self.target - position)
            last = len(self.waypoints) == 1
            slow = np.all(np.abs(velocity) <= GOAL_SPEED) or (last and self.after == "random")
            if (is_route_cell and distance <= GOAL_RADIUS and slow) or (not is_route_cell and distance <= WAYPOINT_RADIUS):
                if last:
                    self.done = True
                else:
                    self.waypoints.pop(0)
                    self._next_target()
        if self.done and self.after == "random":
            return self.rng.uniform(action_space.low, action_space.high).astype(np.float32)
        return np.clip(GAIN * (self.target - position) - DAMPING * velocity, -1.0, 1.0).astype(np.float32)


def drive(env, route, after: str, seed: int, rng: np.random.Generator) -> Episode:
    """One 200-step episode of the controller (route None: uniform random actions)."""
    from offrl.data.suite import rollout

    base = env.unwrapped
    walls = np.array([[cell == 1 for cell in row] for row in base.maze.maze_map])
    if route is None:
        return rollout(env, lambda o: rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32), seed=seed)
    controller = WaypointController(base.maze, walls, route, after, rng)
    started = [False]

    def act(obs):
        if not started[0]:
            controller.start(obs[:2])
            started[0] = True
        return controller(obs, env.action_space)

    return rollout(env, act, seed=seed)


def make_stitch(seed: int = 0, episodes_per_group: int = 250) -> MadeDataset:
    import gymnasium as gym

    from offrl.envs import STITCH_ENV_ID

    env = gym.make(STITCH_ENV_ID)
    rng = np.random.default_rng(seed)
    episodes = []
    for route, after in GROUPS:
        for _ in range(episodes_per_group):
            episodes.append(drive(env, route, after, seed + len(episodes), rng))
    ref_rng = np.random.default_rng(REF_SEED)
    ref_min = float(np.mean([drive(env, None, "hold", REF_SEED + i, ref_rng).rewards.sum() for i in range(REF_EPISODES)]))
    ref_max = float(np.mean([drive(env, BEST_ROUTE, "hold", REF_SEED + i, ref_rng).rewards.sum()
                             for i in range(REF_EPISODES)]))
    spec = env.spec
    env.close()
    returns = [float(e.rewards.sum()) for e in episodes]
    return MadeDataset(
        episodes=episodes, env_spec=spec, ref_min_score=ref_min, ref_max_score=ref_max,
        algorithm_name="waypoint-controller",
        description=("MBRCSL's point-maze stitching data in offrl/PointMazeStitch-v0: a waypoint controller from the "
                     f"start cell, {episodes_per_group} episodes per group: two groups to the middle cell (2, 2), one "
                     "group along the detour (1, 1) -> (2, 1) -> goal (2, 4) holding at the goal, one along the detour "
                     "then random actions. ref_min: uniform random actions; ref_max: the controller on the best route "
                     "(2, 2) -> (2, 4), which the data never drives whole; 100 episodes each."),
        info={"recipe": "pointmaze-stitch", "seed": seed, "episodes_per_group": episodes_per_group,
              "best_return": max(returns), "reference": {"episodes": REF_EPISODES, "seed": REF_SEED}},
    )
