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
  MathOptionsSchema,
  type MathSuiteOptions,
  parseMathOptions,
} from "./env.ts";
export {
  extractAnswer,
  extractAnswerIs,
  extractBoxed,
  extractLastMath,
  extractLastNumber,
} from "./extract.ts";
export {
  checkAnswer,
  type GradeOptions,
  type GradeResult,
  gradeAnswer,
  gradeResponse,
  type ResponseGradeResult,
} from "./grader.ts";
export { closeSharedMathVerifyPool, MathVerifyPool, sharedMathVerifyPool } from "./math-verify-pool.ts";
export { normalizeAnswer } from "./normalize.ts";
export { closeSharedSymbolicPool, SymbolicPool, sharedSymbolicPool } from "./pool.ts";
