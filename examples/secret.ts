// The task the example apps play, as an app would write it (nothing here imports MARFT): a solver
// sees a secret letter, a checker sees only what the solver said and must state the letter. It is
// MARFT's synthetic `secret` task (src/envs/synthetic/secret.ts) written as app code, so that a tiny
// random-init model can learn it in a couple of minutes on a CPU: same tasks, same judging, same
// prompts (the solver's prompt repeats the secret 16 times; a random-init model attends almost
// uniformly, so one letter would be drowned by the chat template).
//
// Judging, as the synthetic tasks do it: letters are grouped by char code modulo 2 ("class"
// matching); an answer is right when its first character (not U+FFFD, which every invalid byte of a
// byte-level model decodes to) is in the secret's class. The untrained team is right ~1/4 of the time.

export interface SecretTask {
  id: string;
  secret: string;
}

const LETTERS = "ab";
const REPEAT = 16;

/** mulberry32: the same task stream as the synthetic suite's, so the tiny recipe's tasks are the same. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function make(seed: number, n: number, prefix: string): SecretTask[] {
  const rng = seeded(seed);
  return Array.from({ length: n }, (_, i) => ({
    id: `${prefix}-${i}`,
    secret: LETTERS[Math.floor(rng() * LETTERS.length)]!,
  }));
}

/** 64 training tasks and 32 held-out ones. */
export const tasks = { train: make(1, 64, "train"), eval: make(2, 32, "eval") };

export function solverPrompt(task: SecretTask): string {
  return `secret: ${task.secret.repeat(REPEAT)}`;
}

export function checkerPrompt(solverSaid: string): string {
  return `secret?\n\nsolver: ${solverSaid}`;
}

function matches(answer: string, secret: string): boolean {
  const first = answer.trimStart()[0];
  if (first === undefined || first === "\uFFFD") return false;
  return first.charCodeAt(0) % LETTERS.length === secret.charCodeAt(0) % LETTERS.length;
}

/**
 * The reward: 1 when the checker states the secret, else 0; and, for the solver's role, the share of
 * its first 16 characters that state the secret (a shaping reward the config routes to the solver).
 */
export function score(task: SecretTask, solverSaid: string, checkerSaid: string) {
  const said = [...solverSaid.trim()].slice(0, REPEAT);
  const solver = said.filter((c) => matches(c, task.secret)).length / REPEAT;
  return { teamReward: matches(checkerSaid, task.secret) ? 1 : 0, roleRewards: { solver } };
}
