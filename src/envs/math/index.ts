// The math task family: dataset loading, answer extraction, the answer checker and the environment.
export {
  datasetName,
  loadMathProblems,
  loadMathSplits,
  type MathProblem,
  type MathSplitOptions,
} from "./data.ts";
export {
  createMathSuite,
  type ExtractMode,
  extractWith,
  MathEnv,
  type MathEnvOptions,
  type MathSuiteOptions,
} from "./env.ts";
export { MathOptionsSchema, MathTaskSchema, mathSuite, parseMathOptions } from "./task.ts";
export { extractAnswer, extractAnswerIs, extractBoxed, extractLastNumber } from "./extract.ts";
export { type GradeOptions, type GradeResult, gradeAnswer } from "./grader.ts";
export { normalizeAnswer } from "./normalize.ts";
export { closeSharedSymbolicPool, SymbolicPool, sharedSymbolicPool } from "./pool.ts";
