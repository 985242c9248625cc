// The framework's errors: a small hierarchy, so that callers decide by class, never by parsing a
// message or sniffing a status code.
//
//   MarftError
//   ├─ ConfigError         the user's run config (or a CLI flag) is wrong: fix it and run again
//   ├─ EnvContractError    a task environment broke the Env contract (src/flexmg/types.ts)
//   ├─ DataError           a dataset file is unreadable or malformed (names the file and line)
//   ├─ EngineError         the compute engine (src/client)
//   │  ├─ EngineUnreachableError  no answer: not running, connection lost, a probe's time limit
//   │  ├─ EngineStalledError      it is there but made no progress for the stall limit
//   │  └─ EngineRefusedError      it answered with an error (4xx: the request was wrong; 5xx: it failed)
//   ├─ RunLockedError      another trainer holds the run directory
//   └─ RunStoppedError     a training run stopped on an error: the cause, its last checkpoint, how to resume
//
// Recovery follows the class: the trainer restarts an engine only after an EngineUnreachableError
// that a health check confirms; a refusal or a config, env or data error ends the run with its message.

export class MarftError extends Error {
  override name = "MarftError";
}

/**
 * A run config, task options or command-line value that does not validate; `issues` are one line
 * each. The message is `<source>: <headline>` and the issues indented below it, or, with a null
 * headline (options checked in code), the issues alone.
 */
export class ConfigError extends MarftError {
  override name = "ConfigError";
  constructor(
    /** The file or flag the issues are about, e.g. `configs/demo.yaml` or `--set`. */
    readonly source: string,
    /** `path: what was expected, got X`, one per problem. */
    readonly issues: string[],
    headline: string | null = "invalid run config",
  ) {
    super(
      headline === null
        ? issues.join("\n")
        : `${source}: ${headline}\n${issues.map((l) => `  ${l}`).join("\n")}`,
    );
  }
}

/** A task environment did something the Env contract forbids (names the episode and what happened). */
export class EnvContractError extends MarftError {
  override name = "EnvContractError";
}

/** A dataset file that cannot be used as it is. */
export class DataError extends MarftError {
  override name = "DataError";
}

/** Anything about the compute engine; `status` 0 means no HTTP answer came. */
export class EngineError extends MarftError {
  override name = "EngineError";
  constructor(
    /** HTTP status; 0 when no response came (connection failure or timeout). */
    readonly status: number,
    /** The engine's error kind (bad_request, not_found, internal, unauthorized, ...), or connection / timeout / aborted. */
    readonly kind: string,
    /** The engine's message, naming the field when it is about a field. */
    readonly engineMessage: string,
    /** e.g. "POST /v1/sample". */
    readonly endpoint: string,
  ) {
    super(`${endpoint}: ${status ? `${status} ${kind}: ` : `${kind}: `}${engineMessage}`);
  }
}

/** No answer from the engine (connection refused or broken, timeout, aborted): it may be gone. */
export class EngineUnreachableError extends EngineError {
  override name = "EngineUnreachableError";
  constructor(kind: "connection" | "timeout" | "aborted", message: string, endpoint: string) {
    super(0, kind, message, endpoint);
  }
}

/**
 * The engine is there but made no progress for the stall limit while a call waited: no call or
 * decode step finished and its compute thread used no CPU time (or it stopped answering at all).
 */
export class EngineStalledError extends EngineError {
  override name = "EngineStalledError";
  constructor(
    endpoint: string,
    /** How long the engine showed no progress while this call waited. */
    readonly stalledSeconds: number,
    /** The limit (engine.stallSeconds). */
    readonly limitSeconds: number,
    /** Whether it still answered /v1/health, in words. */
    answered: string,
  ) {
    super(
      0,
      "stalled",
      `the engine made no progress for ${stalledSeconds.toFixed(1)} s while this call waited ` +
        `(no call or decode step finished and its compute thread used no CPU time; ${answered}; ` +
        `the limit is engine.stallSeconds = ${limitSeconds})`,
      endpoint,
    );
  }
}

/** The engine answered with an error status: the request was wrong (4xx) or the engine failed (5xx). */
export class EngineRefusedError extends EngineError {
  override name = "EngineRefusedError";
}

/** Another trainer holds the run directory (its lock file names the process). */
export class RunLockedError extends MarftError {
  override name = "RunLockedError";
}

/**
 * A training run that stopped on an error after it started: the cause, then the last complete
 * checkpoint and the command that continues from it.
 */
export class RunStoppedError extends MarftError {
  override name = "RunStoppedError";
  constructor(
    readonly reason: Error,
    readonly runDir: string,
    readonly checkpoint: { path: string; iteration: number } | undefined,
  ) {
    super(
      `${reason.message}\n` +
        (checkpoint
          ? `  last checkpoint: ${checkpoint.path} (iteration ${checkpoint.iteration})\n`
          : "  no checkpoint yet: a resume starts the run from the beginning\n") +
        `  continue with: marft train --resume ${runDir}`,
    );
  }
}
