"""`functions`: small function-writing requests, phrased as a person at a terminal would
type them (the README's first example is the first item), each with input/output cases.

Used to choose the default model and template (docs/first-run.md) and by the first-run
test. The answer's code runs in a subprocess: the *last* top-level function it defines
is called on every case (helpers come first in the answers models write).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile

# (item id, prompt, cases: [(args, expected)]); a float expected is compared within 1e-6
FUNCTIONS: tuple[tuple[str, str, list[tuple[list, object]]], ...] = (
    ("is_prime", "Write a Python function that checks whether a number is prime.",
     [([n], n in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 97)) for n in (0, 1, 2, 3, 4, 9, 15, 17, 25, 29, 49, 97, 100)]),
    ("reverse_words", "Write a Python function that reverses the order of the words in a sentence.",
     [(["hello world"], "world hello"), (["the quick brown fox"], "fox brown quick the"), (["single"], "single")]),
    ("fibonacci", "Write a Python function that returns the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1.",
     [([0], 0), ([1], 1), ([2], 1), ([10], 55), ([20], 6765)]),
    ("palindrome", "Write a Python function that checks whether a string is a palindrome, ignoring case and "
                   "any character that is not a letter or a digit.",
     [(["A man, a plan, a canal: Panama"], True), (["race a car"], False), (["No 'x' in Nixon"], True),
      ([""], True)]),
    ("factorial", "Write a Python function that returns the factorial of a non-negative integer.",
     [([0], 1), ([1], 1), ([5], 120), ([10], 3628800)]),
    ("count_vowels", "Write a Python function that counts the vowels (a, e, i, o, u, either case) in a string.",
     [(["hello"], 2), (["AEIOU xyz"], 5), (["rhythm"], 0)]),
    ("gcd", "Write a Python function that returns the greatest common divisor of two positive integers.",
     [([12, 18], 6), ([17, 5], 1), ([100, 75], 25), ([7, 7], 7)]),
    ("flatten", "Write a Python function that flattens a nested list of any depth into a flat list.",
     [([[1, [2, [3, [4]], 5]]], [1, 2, 3, 4, 5]), ([[]], []), ([[[[]], [1]]], [1])]),
    ("second_largest", "Write a Python function that returns the second largest distinct number in a list.",
     [([[3, 1, 4, 4, 2]], 3), ([[10, 20]], 10), ([[5, 5, 7, 7, 6]], 6)]),
    ("roman", "Write a Python function that converts a Roman numeral string to an integer.",
     [(["III"], 3), (["IX"], 9), (["LVIII"], 58), (["MCMXCIV"], 1994)]),
    ("merge_sorted", "Write a Python function that merges two sorted lists into one sorted list.",
     [([[1, 3, 5], [2, 4, 6]], [1, 2, 3, 4, 5, 6]), ([[], [1]], [1]), ([[1, 1], [1]], [1, 1, 1])]),
    ("anagram", "Write a Python function that checks whether two strings are anagrams of each other.",
     [(["listen", "silent"], True), (["apple", "paple"], True), (["rat", "car"], False)]),
    ("dedupe", "Write a Python function that removes duplicates from a list while keeping the original order.",
     [([[3, 1, 3, 2, 1]], [3, 1, 2]), ([[]], []), ([["a", "b", "a"]], ["a", "b"])]),
    ("celsius", "Write a Python function that converts a temperature from Celsius to Fahrenheit.",
     [([0], 32.0), ([100], 212.0), ([-40], -40.0), ([37], 98.6)]),
    ("max_subarray", "Write a Python function that returns the largest sum of a contiguous subarray of a "
                     "non-empty list of integers.",
     [([[-2, 1, -3, 4, -1, 2, 1, -5, 4]], 6), ([[1]], 1), ([[-3, -1, -2]], -1)]),
    ("binary_search", "Write a Python function that returns the index of a target in a sorted list using "
                      "binary search, or -1 if it is not there.",
     [([[1, 3, 5, 7, 9], 7], 3), ([[1, 3, 5, 7, 9], 4], -1), ([[], 1], -1), ([[2], 2], 0)]),
)

_RUNNER = r"""
import ast, json, math, sys
code, cases = sys.stdin.read().split("\x00")
names = [node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)]
if not names:
    sys.exit("the answer defines no function")
space = {"__name__": "candidate"}
exec(compile(code, "candidate", "exec"), space)
function = space[names[-1]]
results = []
for args, expected in json.loads(cases):
    try:
        got = function(*args)
        ok = math.isclose(got, expected, abs_tol=1e-6) if isinstance(expected, float) else got == expected
    except Exception as error:
        got, ok = f"{type(error).__name__}: {error}", False
    results.append([bool(ok), repr(got)[:80]])
print("\nSSR-RESULT " + json.dumps([names[-1], results]))  # the code may print too
"""


def run_cases(code: str, cases: list[tuple[list, object]], timeout: float = 5.0) -> dict:
    """Call the code's last top-level function on each case -> {"function", "passed",
    "cases", "failures": [(args, got, expected)], "error"}."""
    outcome = {"function": None, "passed": 0, "cases": len(cases), "failures": [], "error": ""}
    with tempfile.TemporaryDirectory(prefix="ssr-functions-") as folder:
        try:
            done = subprocess.run([sys.executable, "-c", _RUNNER], cwd=folder, capture_output=True, text=True,
                                  input=code + "\x00" + json.dumps(cases), timeout=timeout)
        except subprocess.TimeoutExpired:
            outcome["error"] = f"timed out after {timeout:.0f} s"
            return outcome
    if done.returncode != 0:
        outcome["error"] = (done.stderr.strip().splitlines() or ["no function"])[-1][:200]
        return outcome
    marked = [line for line in done.stdout.splitlines() if line.startswith("SSR-RESULT ")]
    if not marked:
        outcome["error"] = "the code exited before its function was called"
        return outcome
    name, results = json.loads(marked[-1][len("SSR-RESULT "):])
    outcome["function"] = name
    for (args, expected), (ok, got) in zip(cases, results):
        outcome["passed"] += ok
        if not ok:
            outcome["failures"].append((args, got, repr(expected)))
    return outcome


def items() -> list[tuple[str, str, dict]]:
    """(item id, prompt, reference) for the bench suite."""
    return [(item_id, prompt, {"cases": cases}) for item_id, prompt, cases in FUNCTIONS]

