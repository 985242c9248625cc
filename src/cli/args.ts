// What every `marft <cmd>` does with its arguments before any work: node:util parseArgs, a parse
// error or a wrong number of positionals as "marft <cmd>: <message>\n\n<usage>" on stderr with
// exit code 2, and --help / -h (added to every command's options) as the usage on stdout.
import { type ParseArgsConfig, parseArgs } from "node:util";

type Options = NonNullable<ParseArgsConfig["options"]>;

const HELP = { help: { type: "boolean", short: "h" } } as const;

type Config<O extends Options> = {
  args: string[];
  options: O & typeof HELP;
  allowPositionals: boolean;
  strict: true;
};

export interface Parsed<O extends Options> {
  values: ReturnType<typeof parseArgs<Config<O>>>["values"];
  positionals: string[];
}

export interface CommandRules<O extends Options> {
  /** Without it the command takes no positionals (parseArgs rejects them). A string: exactly one,
   * and the string is the error otherwise. A function: the error for what was given, or undefined. */
  positionals?: string | ((parsed: Parsed<O>) => string | undefined);
}

/** "marft <cmd>: <message>" and the usage on stderr, exit code 2. */
export function usageError(cmd: string, usage: string, message: string): void {
  process.stderr.write(`marft ${cmd}: ${message}\n\n${usage}`);
  process.exitCode = 2;
}

/** The parsed arguments, or undefined when the command is done: the usage was printed for --help,
 * or a usage error (and exit code 2) for bad arguments. */
export function parseCommand<const O extends Options>(
  cmd: string,
  usage: string,
  args: string[],
  options: O,
  rules: CommandRules<O> = {},
): Parsed<O> | undefined {
  let parsed: Parsed<O>;
  try {
    parsed = parseArgs<Config<O>>({
      args,
      options: { ...options, ...HELP },
      allowPositionals: rules.positionals !== undefined,
      strict: true,
    });
  } catch (e) {
    usageError(cmd, usage, (e as Error).message);
    return undefined;
  }
  // (inside this generic function the values type does not show the help field)
  const flags: { help?: boolean } = parsed.values;
  if (flags.help) {
    process.stdout.write(usage);
    return undefined;
  }
  const check = rules.positionals;
  const error =
    typeof check === "string" ? (parsed.positionals.length === 1 ? undefined : check) : check?.(parsed);
  if (error !== undefined) {
    usageError(cmd, usage, error);
    return undefined;
  }
  return parsed;
}
