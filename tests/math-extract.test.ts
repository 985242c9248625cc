import { describe, expect, it } from "vitest";
import {
  extractAnswer,
  extractAnswerIs,
  extractBoxed,
  extractLastMath,
  extractLastNumber,
} from "../src/envs/math/extract.ts";

describe("extractBoxed", () => {
  it("joins an answer split over boxes that stand together", () => {
    expect(extractBoxed("so the roots are \\boxed{-2} and \\boxed{1}.")).toBe("-2, 1");
    expect(extractBoxed("$\\boxed{2}$, $\\boxed{3}$, $\\boxed{5}$")).toBe("2, 3, 5");
    expect(extractBoxed("\\[ \\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)} \\]")).toBe(
      "(2, 2), (6, 2)",
    );
    expect(extractBoxed("\\boxed{1}\\boxed{2}")).toBe("1, 2");
  });

  it("keeps boxes apart when prose stands between them", () => {
    expect(extractBoxed("first guess \\boxed{3}. Checking again, it is \\boxed{4}")).toBe("4");
    expect(extractBoxed("\\boxed{840}.\n\n**Final Answer**\n\\boxed{840}")).toBe("840");
  });

  it("handles nesting, \\fbox and an unclosed last box", () => {
    expect(extractBoxed("\\boxed{\\frac{1}{2}}")).toBe("\\frac{1}{2}");
    expect(extractBoxed("\\fbox{7}")).toBe("7");
    expect(extractBoxed("\\boxed{1} then \\boxed{2")).toBeNull();
  });
});

describe("extractAnswerIs", () => {
  it("takes the answer, not the rest of the sentence", () => {
    expect(extractAnswerIs("The answer is 5 because the sides are equal.")).toBe("5");
    expect(extractAnswerIs("so the final answer is 12, which is even")).toBe("12");
    expect(extractAnswerIs("The answer is $\\frac{3}{4}$ since ...")).toBe("\\frac{3}{4}");
    expect(extractAnswerIs("the answer is: **42**")).toBe("42");
  });
});

describe("extractAnswer", () => {
  it("prefers a final statement written after the box", () => {
    const text =
      "so $\\boxed{255}$ is earned. In all she has $10,455. Final Answer: The final answer is $10,455$.";
    expect(extractAnswer(text)).toBe("10,455");
    // an "answer is" that is not final does not override the box
    expect(extractAnswer("first \\boxed{41}, no wait: the answer is 42.")).toBe("41");
  });

  it("falls back to the last math span, then the last number, only when asked", () => {
    const prose = "We find $x = 3$ and so the total is $x + 4 = 7$.";
    expect(extractAnswer(prose)).toBeNull();
    expect(extractAnswer(prose, { lastMath: true })).toBe("x + 4 = 7");
    expect(extractLastMath("the roots are $1$ and $2$")).toBe("1, 2");
    expect(extractLastMath("Answer $ \n 9 \n $")).toBeNull(); // inline math never spans lines
    expect(extractAnswer("she pays 42 dollars", { lastNumber: true })).toBe("42");
  });
});

describe("extractLastNumber", () => {
  it("skips code, exponents, subscripts and LaTeX arguments", () => {
    // a response that never answers: the number in its code block is not an answer
    expect(extractLastNumber("Let me compute it:\n```python\nprint(2 ** 10)\n```\nHmm.")).toBeNull();
    expect(extractLastNumber("use `n = 5` first")).toBeNull();
    expect(extractLastNumber("the area is x^2")).toBeNull();
    expect(extractLastNumber("so a_1 is the start")).toBeNull();
    expect(extractLastNumber("it is 7 and not \\frac{1}{2}")).toBe("7");
  });

  it("reads thousands groups, decimal commas and fractions whole", () => {
    expect(extractLastNumber("in total 7,425,000 people")).toBe("7425000");
    expect(extractLastNumber("about 1 000 units")).toBe("1000");
    expect(extractLastNumber("le prix est 2,74 euros")).toBe("2,74");
    expect(extractLastNumber("P(A) = 2/3 in the end")).toBe("2/3");
    expect(extractLastNumber("the step was 32, then 349")).toBe("349");
  });
});
