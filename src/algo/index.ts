// Credit assignment and statistics: pure functions, no I/O (DESIGN §4).
export {
  type Credit,
  type CreditBatch,
  type CreditParams,
  type CreditStep,
  criticFree,
  ESTIMATORS,
  type Estimator,
  type EstimatorName,
  marftA,
  marftT,
  normalizeCredit,
} from "./credit.ts";
export { type GaeResult, actionGae, tokenGae } from "./gae.ts";
export { flatGroups, groupRelative } from "./baselines.ts";
export { cappedImportanceWeights, truncatedImportanceWeights, weightedAdvantages } from "./offpolicy.ts";
export { type RewardRouting, routeRewards } from "./rewards.ts";
export { DEFAULT_ZERO_EPS, normalizePerAgent, ZeroAdvantageDetector } from "./normalize.ts";
export {
  accuracyCi95,
  chiSquareGoodnessOfFit,
  explainedVariance,
  mean,
  meanInterval,
  normalCdf,
  pairedDifference,
  pairedTest,
  pairedTTest,
  passAtK,
  std,
  twoProportionZTest,
  wilsonInterval,
} from "./stats.ts";
export { chiSquareSurvival, studentTCdf, studentTQuantile } from "./distributions.ts";
