"""`jumpahead train-drafter`: train the learned drafter (engine/methods/drafter.py) for a target.

Self-distilled: the target writes its own data. Training prompts are every assistant
turn of the task world's training-seed trajectories (never a held-out seed), the
public agent sessions in ../shared/traces/public where present (each cut to its last
`--context` tokens), and coding and prose requests built from the Python standard
library's sources. The real engine continues them greedily (`--continue-tokens`, rows
batched) until `--generate-minutes` is spent, and a recording proposer keeps, at every
round, each row's pending token and the hidden state that chose it: exactly what the
drafter reads when serving, with no second forward.

The drafter learns (h_t, x_{t+1}) -> x_{t+2} and, chained on its own predicted hidden
state, (h'_{t+1}, x_{t+2}) -> x_{t+3}, with a regression of h'_{t+1} onto h_{t+1}; the
head covers the `--draft-vocab` tokens the target emits most and starts from the
target's embedding rows. Agreement at chained steps 1 and 2 on held-back rows is what
acceptance will look like. None of the benchmark's prompts (bench/drafter.py) is used.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from jumpahead.engine.methods.drafter import Drafter, default_drafter_path, target_fingerprint
from jumpahead.traces.progress import Progress

SHARED_PUBLIC = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "public"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="drafter folder to write (default: the one shipped for the default model, "
                             "engine/weights/drafters/smollm2-135m)")
    parser.add_argument("--model", default=None, metavar="PATH", help="target model (default: the embedded one)")
    parser.add_argument("--adapter", default=None, metavar="NAME|DIR",
                        help="train for the model with this LoRA adapter fused (a shipped name such as "
                             "smol-agent, or a folder); the drafter goes to the adapter's drafter/ folder, "
                             "which `serve --adapter ... --drafter auto` loads")
    parser.add_argument("--world-tasks", type=int, default=100, help="training-seed trajectories of the task world")
    parser.add_argument("--sessions", default=str(SHARED_PUBLIC), metavar="DIR",
                        help="public agent sessions to take prompts from (skipped where absent)")
    parser.add_argument("--session-turns", type=int, default=160, help="most public-session turns used")
    parser.add_argument("--code-prompts", type=int, default=400,
                        help="coding and prose requests built from the standard library's sources")
    parser.add_argument("--batch-rows", type=int, default=16, help="rows the engine generates together")
    parser.add_argument("--context", type=int, default=384, help="prompt tokens kept before each answer")
    parser.add_argument("--reuse-prefixes", action="store_true",
                        help="generate the task world's turns first, whole and in turn order through the prefix "
                             "cache, so each turn prefills only what it added (the other sources follow, "
                             "shuffled): agent turns cost prefill, not decoding, on a CPU")
    parser.add_argument("--continue-tokens", type=int, default=128, help="greedy tokens the target writes per prompt")
    parser.add_argument("--generate-minutes", type=float, default=14.0, help="time for the greedy continuations")
    parser.add_argument("--train-minutes", type=float, default=12.0, help="time for training")
    parser.add_argument("--batch", type=int, default=512, help="positions per training step")
    parser.add_argument("--ffn", type=int, default=1024, help="the drafter's SwiGLU width")
    parser.add_argument("--draft-vocab", type=int, default=4096, help="target tokens the head can draft")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--general-prompts", type=int, default=0,
                        help="everyday requests (explanations, new code, stories, worked problems) built from "
                             "word lists, none of them the benchmark's")
    gpu = parser.add_argument_group("training on a CUDA machine (training/train_drafter_torch.py)")
    gpu.add_argument("--export-prompts", default=None, metavar="DIR",
                     help="write the tokenized prompts (prompts.npz, with the engine's hidden states for one "
                          "prompt to check the torch forward against) and stop")
    gpu.add_argument("--import-weights", default=None, nargs="+", metavar="FILE",
                     help="make a drafter folder (--out) of the weights file(s) train_drafter_torch.py wrote "
                          "for one variant; --summary FILE adds its training summary")
    gpu.add_argument("--summary", default=None, metavar="FILE", help="with --import-weights: its summary.json")


# --- prompts --------------------------------------------------------------------------


def _ids(tokenizer: Any, messages: list[dict], tools: list | None, **kw: Any) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, return_dict=False, **kw)
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "input_ids") else ids)]


def world_prompts(tokenizer: Any, n_tasks: int, context: int) -> list[list[int]]:
    """The prompt tail before every assistant turn of `n_tasks` training trajectories
    (turns the template renders as a continuation of their prompt)."""
    return [p[-context:] for task in world_turns(tokenizer, n_tasks) for p in task]


def world_turns(tokenizer: Any, n_tasks: int, split: str = "train") -> list[list[list[int]]]:
    """Per trajectory of the split's first `n_tasks` seeds (training data: "train";
    `bench drafter --adapter`: "heldout"), the whole prompt before each assistant turn."""
    from jumpahead.live.trajectories import generate
    from jumpahead.live.world import split_seeds

    out = []
    for traj in generate(split_seeds(split, n_tasks)):
        msgs, tools = traj["messages"], traj["tools"]
        turns = []
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = _ids(tokenizer, msgs[:i], tools, add_generation_prompt=True)
            whole = _ids(tokenizer, msgs[: i + 1], tools)
            if whole[: len(prompt)] == prompt and len(whole) > len(prompt):
                turns.append(prompt)
        out.append(turns)
    return out


def turn_major(tasks: list[list[list[int]]], rows: int) -> list[list[list[int]]]:
    """The tasks' turn prompts in batches that each reuse the batch before from the
    prefix cache: `rows` tasks at a time, their first turns in one batch, then their
    second turns in the next, ... A turn's prompt extends the previous turn's prompt
    (published to the cache at its prompt boundary, a batch earlier), so it prefills
    only what that turn added (the assistant's message and the tool result), not the
    whole history: on this CPU prefill, not decoding, is what agent turns cost."""
    out = []
    for g in range(0, len(tasks), rows):
        group = tasks[g : g + rows]
        for t in range(max((len(x) for x in group), default=0)):
            out.append([x[t] for x in group if t < len(x)])
    return out


def session_prompts(tokenizer: Any, folder: str, context: int) -> list[list[int]]:
    """The prompt tail before each of the public sessions' assistant turns."""
    from jumpahead.traces.formats import load_sessions
    from jumpahead.traces.replay import ReplayOptions, plan_session

    out = []
    for path in sorted(glob.glob(str(Path(folder) / "*" / "*"))):
        if path.endswith(".md"):
            continue
        try:
            sessions = load_sessions(path)
        except Exception as exc:  # a file no importer reads: say so, go on
            print(f"train-drafter: skipping {path}: {exc}", file=sys.stderr)
            continue
        for session in sessions:
            options = ReplayOptions(arms=[], turns=None, max_context=4096, max_output_tokens=None)
            out += [p.prompt[-context:] for p in plan_session(session, tokenizer, 8192, options)[0]]
    return out


def code_prompts(tokenizer: Any, n: int, rng: random.Random) -> list[list[int]]:
    """Coding and prose requests built from the Python standard library's own sources
    (functions to explain, test or rewrite; module docs to summarize or use): the
    kinds of answer an agent writes besides tool calls, from text on every machine."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    funcs, docs = [], []
    for path in files:
        try:
            text = path.read_text()
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        doc = ast.get_docstring(tree)
        if doc and len(doc) > 200:
            docs.append((path.stem, doc[:900]))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and 4 <= (node.end_lineno or 0) - node.lineno <= 30:
                funcs.append(ast.get_source_segment(text, node) or "")
    asks = ["Explain what this Python function does, step by step:", "Write unit tests with pytest for this function:",
            "Rewrite this function with type hints and a docstring:", "Find possible bugs in this function:",
            "Describe how to use this function, with an example:"]
    about = ["Summarize this documentation in plain words:", "Write a short example program that uses the `{}` "
             "module as described here:", "List the main points of this text:"]
    out = []
    for i in range(n):
        if i % 3 == 2 and docs:
            name, doc = rng.choice(docs)
            text = f"{rng.choice(about).format(name)}\n\n{doc}"
        else:
            text = f"{rng.choice(asks)}\n```python\n{rng.choice(funcs)}\n```"
        out.append(_ids(tokenizer, [{"role": "user", "content": text}], None, add_generation_prompt=True))
    return out


# Everyday requests, combined from word lists so they are many and varied: what an
# assistant writes besides tool calls (explanations, new code, stories, worked
# problems, letters, comparisons). Every drawn request is distinct: greedy decoding
# writes the same continuation for the same prompt, so a repeat only adds weight to
# one text (the first GPU run drew 4,000 from 2,400 distinct ones and its held-back
# agreement counted repeats). The benchmark's held-out prompts (bench/drafter.py) are
# none of these; their subjects (merging sorted lists, processes vs threads, a
# lighthouse keeper, a train's arrival time) are kept out (HELD_OUT_WORDS).
HELD_OUT_WORDS = ("merg", "lighthouse", "thread", "process", "train")
# The benchmark's turns with nothing to copy (bench/drafter.py runs them): held out from
# every training source above, kept here so that training can measure on them too.
NOTHING_TO_COPY = [
    "A train leaves at 3:40 pm and the trip takes 2 hours 35 minutes. Work out step by step when it arrives.",
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring and tests.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain the difference between a process and a thread, with an example of when to use each.",
]
_CODE_TASKS = [
    "checks whether a string is a palindrome", "counts the words in a text file", "flattens a nested list",
    "parses a CSV line with quoted fields", "computes the n-th Fibonacci number iteratively",
    "finds the longest common prefix of a list of strings", "validates an email address with a regular expression",
    "removes duplicate items from a list while keeping their order", "converts a Roman numeral to an integer",
    "groups a list of words by their first letter", "computes a moving average over a list of numbers",
    "reads a JSON file and prints its keys", "implements binary search on a sorted list",
    "rotates a matrix by 90 degrees", "checks whether two strings are anagrams", "implements a simple LRU cache",
    "counts how often each character occurs in a string", "converts Celsius to Fahrenheit for a list of values",
    "finds all prime numbers below n with a sieve", "splits a list into chunks of size k",
    "computes the greatest common divisor of two numbers", "reverses the words in a sentence",
    "formats a number of seconds as hours, minutes and seconds", "implements a stack with push, pop and peek",
    "transposes a list of lists", "finds the second largest number in a list", "capitalizes every sentence in a text",
    "computes the median of a list", "checks whether parentheses in a string are balanced",
    "renames all .txt files in a folder to .md", "retries a function call up to three times on error",
    "parses command-line arguments for an input and an output file", "implements a queue with two stacks",
    "computes the factorial of n recursively", "converts a dictionary to a query string",
    "finds the most common element in a list", "encodes a string with run-length encoding",
    "measures how long a function takes to run", "reads a file line by line and skips comment lines",
    "computes the dot product of two vectors", "builds a histogram of word lengths",
    "converts a binary string to a decimal number", "checks whether a year is a leap year",
    "finds the intersection of two lists", "shuffles a list without using a library shuffle",
    "counts the vowels in a string", "converts a string to title case", "sums the digits of a number",
    "finds the missing number in a list from 1 to n", "checks whether a number is a power of two",
    "computes the area of a circle from its radius", "generates a random password of a given length",
    "removes all whitespace from a string", "finds the longest word in a sentence",
    "converts a list of tuples into a dictionary", "pads a string to a fixed width",
    "computes the standard deviation of a list", "finds pairs in a list that add up to a target",
    "checks whether a list is sorted", "inverts a dictionary", "counts lines, words and bytes like wc",
    "truncates a string to n characters with an ellipsis", "finds the index of the maximum value",
    "converts snake_case names to camelCase", "parses a date string in ISO format",
    "computes the Levenshtein distance between two strings", "builds a frequency table from a list",
    "draws a text progress bar", "implements a linked list with insert and delete",
    "implements depth-first search on a graph", "implements breadth-first search on a grid",
    "finds the shortest path in a weighted graph with Dijkstra's algorithm", "compresses repeated spaces",
    "validates a phone number", "converts hexadecimal colors to RGB tuples", "computes compound interest",
    "deep-copies a nested dictionary", "memoizes a slow function", "paginates a list of items",
    "debounces repeated calls to a function", "checks whether a Sudoku row is valid",
    "computes the running total of a list", "finds the mode of a list of numbers",
    "zips two lists into a list of pairs", "splits a full name into first and last name",
    "counts the files in a directory tree", "reads environment variables with defaults",
    "converts miles to kilometers", "checks whether a string contains only digits",
    "escapes HTML special characters", "finds the common elements of three lists",
    "implements a min-heap", "implements a trie for word lookup", "computes the power set of a set",
    "generates all permutations of a string", "rounds a number to the nearest multiple of five",
    "implements quicksort", "implements insertion sort", "computes the nth triangular number",
    "returns the unique words of a text in alphabetical order", "computes a checksum of a file",
    "parses key=value pairs from a config file", "converts a list of numbers into a comma-separated string",
]
_OBJECTS = ["bank account with deposit and withdraw", "shopping cart that totals its items", "to-do list",
            "temperature sensor reading", "deck of playing cards", "library book with a due date",
            "2D point with a distance method", "rectangle with area and perimeter", "simple counter",
            "student with a list of grades", "inventory of products", "timer that can be paused",
            "matrix with addition and multiplication", "fraction with arithmetic operators", "polynomial",
            "priority queue", "rate limiter", "URL builder", "event log", "configuration object"]
_LANGUAGES = ["Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "Bash",
              "C++", "Ruby", "C#", "Kotlin", "PHP", "Swift", "Lua", "R"]
_CODE_ASKS = ["Write a {lang} function that {task}.", "Show me how to write a {lang} program that {task}.",
              "Implement a {lang} function that {task}, and explain it briefly.",
              "Write a {lang} function that {task}. Include a short usage example.",
              "I need {lang} code that {task}. Keep it simple.", "How would you write a {lang} function that {task}?",
              "Can you write {lang} code that {task}? Add comments.",
              "Write a {lang} function that {task}, then explain its time complexity."]
_CLASS_ASKS = ["Write a {lang} class for a {obj}.", "Design a {lang} class that models a {obj}, with an example.",
               "Implement a {obj} in {lang} and show how to use it."]
_TOPICS = [
    "recursion", "a hash table", "big-O notation", "garbage collection", "a REST API", "TCP and UDP",
    "a mutex", "dependency injection", "unit testing", "version control with git", "a linked list",
    "public-key cryptography", "a database index", "caching", "DNS", "an operating system kernel", "compilers",
    "virtual memory", "functional programming", "object-oriented programming", "a binary tree", "sorting algorithms",
    "regular expressions", "HTTP status codes", "containers like Docker", "continuous integration",
    "floating-point numbers", "Unicode and UTF-8", "event loops", "type systems", "SQL joins",
    "the difference between a list and a tuple in Python", "immutability", "a deadlock", "load balancing",
    "photosynthesis", "the water cycle", "how vaccines work", "inflation", "the greenhouse effect",
    "how a bicycle stays upright", "why the sky is blue", "how airplanes fly", "black holes", "plate tectonics",
    "compound interest", "the scientific method", "supply and demand", "how the heart pumps blood",
    "closures", "generators in Python", "decorators in Python", "async and await", "memory leaks",
    "pointers in C", "stack and heap memory", "an API key", "OAuth", "JSON", "YAML", "web sockets",
    "a content delivery network", "microservices", "a message queue", "database transactions", "normalization",
    "a B-tree", "graph algorithms", "dynamic programming", "greedy algorithms", "machine learning",
    "neural networks", "overfitting", "gradient descent", "a compiler's parser", "an interpreter",
    "static and dynamic typing", "the CAP theorem", "eventual consistency", "hashing passwords", "encryption",
    "a firewall", "IP addresses", "the OSI model", "cloud computing", "serverless functions",
    "test-driven development", "code refactoring", "technical debt", "semantic versioning", "pair programming",
    "the moon's phases", "tides", "the seasons", "earthquakes", "volcanoes", "evolution", "DNA", "the immune system",
    "sleep", "the stock market", "interest rates", "taxes", "renewable energy", "electric cars", "batteries",
    "magnets", "electricity", "gravity", "friction", "sound waves", "rainbows", "the solar system", "stars",
    "the Roman Empire", "the printing press", "the industrial revolution", "democracy", "recycling",
    "climate change", "bees and pollination", "how the internet works", "how a search engine works",
    "how email is delivered", "how a CPU executes instructions", "how GPS works", "how a refrigerator works",
]
_EXPLAIN = ["Explain {topic} in simple terms.", "What is {topic}? Give an example.",
            "Explain {topic} to a beginner, step by step.", "Why does {topic} matter? Answer briefly.",
            "Give me a short overview of {topic} and a common misconception about it.",
            "How would you explain {topic} to a ten-year-old?", "Write a short paragraph about {topic}.",
            "What are the pros and cons of {topic}?", "Summarize {topic} in three bullet points."]
_COMPARE = ["What is the difference between {a} and {b}?", "Compare {a} and {b}. When would you use each?",
            "{a} or {b}: which should a beginner learn first, and why?"]
_PAIRS = [("a list", "a set"), ("SQL", "NoSQL databases"), ("TCP", "UDP"), ("git merge", "git rebase"),
          ("a compiler", "an interpreter"), ("Python", "JavaScript"), ("recursion", "iteration"),
          ("a stack", "a queue"), ("an array", "a linked list"), ("HTTP", "HTTPS"), ("RAM", "a hard disk"),
          ("weather", "climate"), ("a virus", "a bacterium"), ("speed", "velocity"), ("mass", "weight"),
          ("saving", "investing"), ("a class", "an object"), ("an interface", "an abstract class"),
          ("unit tests", "integration tests"), ("REST", "GraphQL"), ("cookies", "local storage"),
          ("a library", "a framework"), ("static typing", "dynamic typing"), ("Linux", "Windows"),
          ("a tablet", "a laptop"), ("tea", "coffee"), ("running", "swimming"), ("renting", "buying a home")]
_STORY = ["a robot learning to paint", "a cat who runs a bakery", "two friends lost in a forest", "a time traveler "
          "who misses the bus", "a dragon afraid of fire", "a child who finds a secret door", "an astronaut "
          "alone on Mars", "a detective solving a missing sandwich case", "a town where it never stops raining",
          "a musician who loses her voice", "a gardener who grows a giant pumpkin", "a ghost who wants friends"]
_CHARACTERS = ["a shy robot", "an old fisherman", "a curious fox", "a young wizard", "a retired pirate",
               "a talking tree", "a lonely astronaut", "a clumsy knight", "a brave little mouse", "a grumpy baker",
               "a famous chef", "a tired teacher", "a lost puppy", "a clever squirrel", "a nervous student",
               "a kind giant", "a forgetful inventor", "a small dragon", "a princess who hates castles",
               "a farmer", "a painter", "a mail carrier", "a night watchman", "a street musician", "a penguin",
               "an owl", "a programmer", "a grandmother", "twin sisters", "a detective", "a firefighter",
               "a scientist", "a beekeeper", "a snowman", "a pilot", "a librarian", "a bus driver", "a turtle"]
_SITUATIONS = ["who finds a map to a hidden treasure", "who wakes up able to fly", "who has to save a village",
               "who opens a tiny restaurant", "who makes an unlikely friend", "who gets lost in a big city",
               "who enters a cooking contest", "who discovers a door in the basement", "who loses a magic key",
               "who must cross a frozen lake", "who builds a machine that talks", "who plants a strange seed",
               "on the first day of school", "during a big storm", "on a trip to the moon",
               "who wants to become a singer", "who finds a talking cat", "who solves a mystery at the zoo",
               "who travels back to the year 1900", "who is afraid of the dark", "on a long summer holiday",
               "who learns to dance", "who runs for mayor", "who guards a secret garden", "who can read minds",
               "who finds an old diary", "who climbs the tallest mountain", "who gets a letter from the future"]
_WRITING = ["Write a short story about {s}.", "Write a poem about {s}.", "Write a funny short story about {s}.",
            "Write the opening paragraph of a novel about {s}.", "Tell me a bedtime story about {s}.",
            "Write a haiku about {s}.", "Write a short fable about {s}, with a moral at the end."]
_PROBLEMS = [
    "A shop sells pens at {a} cents each. How much do {b} pens cost? Show your steps.",
    "If a rectangle is {a} cm long and {b} cm wide, what are its area and perimeter? Explain step by step.",
    "Tom has {a} apples and gives away {b}. Then he buys twice as many as he has left. How many does he have now?",
    "A car drives {a} km in {b} hours. What is its average speed? Work it out step by step.",
    "What is {a} percent of {c}? Explain how you get the answer.",
    "A class has {c} students and {a} of them are absent. What fraction is present? Simplify it.",
    "Solve for x: {a}x + {b} = {c}. Show each step.",
    "A recipe needs {a} eggs for {b} people. How many eggs are needed for {c} people? Explain.",
    "A tank holds {c} liters and fills at {a} liters per minute. How long until it is full? Show your work.",
    "Anna reads {a} pages a day. How many days does she need for a book of {c} pages?",
    "A jacket costs {c} dollars and is on sale for {a} percent off. What is the sale price? Explain.",
    "What is {a} times {b}, minus {c}? Show the steps.",
    "A garden is {a} meters by {b} meters. How much fence is needed to go around it?",
    "If {a} workers build a wall in {b} days, how long would {c} workers take? Explain your reasoning.",
    "Is {c} a prime number? Explain how you check.", "Convert {c} minutes into hours and minutes.",
    "The sum of two numbers is {c} and their difference is {a}. What are the numbers? Show your steps.",
    "A bag has {a} red and {b} blue marbles. What is the probability of picking a red one?",
]
_ADVICE = ["How do I get better at {x}?", "Give me five tips for {x}.", "What are common mistakes in {x}?",
           "Make a one-week plan for {x}.", "What should a beginner know about {x}?",
           "I keep struggling with {x}. What can I do?"]
_ACTIVITIES = ["learning to code", "writing clear emails", "debugging Python programs", "studying for exams",
               "public speaking", "code reviews", "learning a new language", "time management", "running",
               "cooking on a budget", "reading research papers", "writing documentation", "saving money",
               "sleeping well", "learning the guitar", "job interviews", "writing unit tests", "drawing",
               "gardening", "staying focused while working from home", "learning SQL", "managing a small team",
               "taking notes", "learning math", "making friends in a new city", "planning a trip",
               "writing a resume", "keeping a journal", "learning to swim", "naming variables"]
_LETTERS = ["Write an email to {who} about {what}.", "Write a short, polite message to {who} about {what}.",
            "Draft a formal letter to {who} regarding {what}."]
_RECIPIENTS = ["my manager", "a customer", "my landlord", "a teacher", "my team", "a new colleague",
               "a friend", "the city council", "a hiring manager", "my neighbor"]
_MATTERS = ["a delayed project", "a broken heater", "taking a day off", "a meeting next week", "a refund",
            "a job application", "a noisy party", "a thank-you for their help", "a change in schedule",
            "an invoice that was paid twice", "joining a volunteer group", "a missing package"]
_VERBS = {"Return": "returns", "Compute": "computes", "Convert": "converts", "Check": "checks", "Parse": "parses",
          "Find": "finds", "Create": "creates", "Remove": "removes", "Split": "splits", "Read": "reads",
          "Write": "writes", "Format": "formats", "Test": "tests", "Encode": "encodes",
          "Decode": "decodes", "Generate": "generates", "Count": "counts", "Build": "builds", "Make": "makes",
          "Calculate": "calculates", "Normalize": "normalizes", "Strip": "strips", "Join": "joins"}


def _library_tasks() -> list[str]:
    """Code tasks from the first line of the standard library's function docstrings
    ("Return the ...": "returns the ..."): hundreds of distinct small functions."""
    import ast
    import sysconfig

    out = set()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if {"test", "tests", "idlelib", "site-packages", "dist-packages"} & set(path.parts):
            continue
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            line = (ast.get_docstring(node) or "").split("\n")[0].strip()
            if not line.endswith(".") or "  " in line:  # a whole one-sentence summary only
                continue
            verb, _, rest = line[:-1].partition(" ")
            if verb in _VERBS and 15 <= len(rest) <= 90 and not any(c in rest for c in "`*<>|{}") \
                    and "self" not in rest:
                out.add(f"{_VERBS[verb]} {rest[0].lower()}{rest[1:]}")
    return sorted(t for t in out if not any(w in t.lower() for w in HELD_OUT_WORDS))


def _general_request(kind: int, rng: random.Random, library: list[str]) -> str:
    if kind in (0, 1):
        tasks = library if kind == 1 and library else _CODE_TASKS
        return rng.choice(_CODE_ASKS).format(lang=rng.choice(_LANGUAGES), task=rng.choice(tasks))
    if kind == 2:
        return rng.choice(_CLASS_ASKS).format(lang=rng.choice(_LANGUAGES), obj=rng.choice(_OBJECTS))
    if kind == 3:
        return rng.choice(_EXPLAIN).format(topic=rng.choice(_TOPICS))
    if kind == 4:
        a, b = rng.choice(_PAIRS)
        return rng.choice(_COMPARE).format(a=a, b=b)
    if kind in (5, 6):
        s = rng.choice(_STORY) if rng.random() < 0.1 else f"{rng.choice(_CHARACTERS)} {rng.choice(_SITUATIONS)}"
        return rng.choice(_WRITING).format(s=s)
    if kind == 7:
        a, b = rng.randint(2, 60), rng.randint(2, 30)
        return rng.choice(_PROBLEMS).format(a=a, b=b, c=rng.randint(a + b, 400))
    if kind == 8:
        return rng.choice(_ADVICE).format(x=rng.choice(_ACTIVITIES))
    return rng.choice(_LETTERS).format(who=rng.choice(_RECIPIENTS), what=rng.choice(_MATTERS))


def general_prompts(tokenizer: Any, n: int, rng: random.Random) -> list[list[int]]:
    """`n` distinct everyday requests drawn from the lists above (see their comment);
    fewer where the lists run out."""
    library = _library_tasks() if n else []
    seen: set[str] = set()
    out = []
    for i in range(n * 20):
        if len(out) >= n:
            break
        text = _general_request(i % 10, rng, library)
        if text in seen or any(w in text.lower() for w in HELD_OUT_WORDS):
            continue
        seen.add(text)
        out.append(_ids(tokenizer, [{"role": "user", "content": text}], None, add_generation_prompt=True))
    return out


# --- the target writes the data --------------------------------------------------------


class HiddenRecorder:
    """A proposer that proposes nothing and keeps, each round, the row's pending token
    and the target's hidden state that chose it (RowView.hidden): the drafter's inputs,
    straight from the engine's own decoding, with no second forward."""

    name = "hidden-recorder"

    def __init__(self) -> None:
        self.hidden: list[np.ndarray] = []
        self.tokens: list[int] = []
        self.prompt_tokens = self.cached_tokens = 0  # the row's prompt, and how much of it the prefix cache served

    def propose(self, view: Any, max_len: int) -> None:
        if len(view.tokens) > view.prompt_len and view.hidden is not None:  # not before the first token
            self.hidden.append(np.array(view.hidden.astype(mx.float16)))
            self.tokens.append(int(view.tokens[-1]))
        return None

    def feedback(self, proposal: Any, accepted: int) -> None:
        pass


def generate(engine: Any, batches: list[list[list[int]]], n: int, minutes: float, progress: Progress,
             prefill: dict[str, int] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy continuations of the prompts through the real engine, a batch at a time
    (build_prompts), until time is up: per prompt, the hidden states [n, D] and pending tokens [n].
    `prefill` (when given) adds up the prompts' tokens and those the prefix cache served."""
    from jumpahead.engine.types import GenerationRequest

    engine.runner.keep_hidden = True

    async def one(prompt: list[int]) -> HiddenRecorder:
        rec = HiddenRecorder()
        async for chunk in engine.stream(GenerationRequest(prompt=prompt, max_tokens=n, methods=["off"],
                                                           proposers=[rec])):
            if chunk.finish_reason is not None:
                rec.prompt_tokens, rec.cached_tokens = len(prompt), chunk.cached_tokens
        return rec

    async def batch(ps: list[list[int]]) -> list[HiddenRecorder]:
        return await asyncio.gather(*[one(p) for p in ps])

    deadline = time.monotonic() + minutes * 60
    out = []
    for i, prompts in enumerate(batches):
        if time.monotonic() > deadline:
            break
        for rec in asyncio.run(batch(prompts)):
            if prefill is not None:
                prefill["prompt_tokens"] = prefill.get("prompt_tokens", 0) + rec.prompt_tokens
                prefill["cached_tokens"] = prefill.get("cached_tokens", 0) + rec.cached_tokens
            if len(rec.tokens) > 3:
                out.append((np.stack(rec.hidden), np.array(rec.tokens, dtype=np.int32)))
        progress.advance(len(prompts))
        if i % 5 == 0:
            say(f"{len(out)} continuations, {sum(len(t) for _, t in out)} tokens")
    return out


# --- training -------------------------------------------------------------------------
#
# Layout: the rows' records concatenated; X[i] is a row's pending token at round i and
# H[i] the hidden state that chose it, so the drafter's step maps (H[i], X[i]) to X[i+1]
# (regressing its hidden onto H[i+1]), and chained, (h', X[i+1]) to X[i+2].


def examples(starts: np.ndarray) -> np.ndarray:
    """Indices i with i+2 in the same row (two chained steps)."""
    return np.concatenate([np.arange(a, b - 2) for a, b in zip(starts[:-1], starts[1:]) if b - a > 2])


def draft_vocab(tokens: np.ndarray, size: int) -> np.ndarray:
    counts = np.bincount(tokens)
    return np.argsort(-counts, kind="stable")[:size].astype(np.int32)


class Trainer:
    def __init__(self, drafter: Drafter, embed: nn.Module, t2d: mx.array, lr: float, steps: int) -> None:
        self.drafter, self.embed, self.t2d = drafter, embed, t2d
        warm = min(100, max(1, steps // 10))
        schedule = optim.join_schedules([optim.linear_schedule(lr / 20, lr, warm),
                                         optim.cosine_decay(lr, max(steps, 1), lr / 20)], [warm])
        self.opt = optim.AdamW(learning_rate=schedule, weight_decay=0.0)
        self.grad = nn.value_and_grad(drafter, self.loss)

    def loss(self, h0: mx.array, h1: mx.array, x1: mx.array, x2: mx.array, y1: mx.array, y2: mx.array) -> mx.array:
        d = self.drafter
        p1, l1 = d.step(h0, self.embed(x1))
        _, l2 = d.step(p1, self.embed(x2))
        total = mx.array(0.0)
        for logits, y in ((l1, y1), (l2, y2)):
            target = self.t2d[y]
            keep = target >= 0
            ce = nn.losses.cross_entropy(logits, mx.maximum(target, 0))
            total = total + (ce * keep).sum() / mx.maximum(keep.sum(), 1)
        return total + nn.losses.smooth_l1_loss(p1, h1, reduction="mean")

    def step(self, *batch: mx.array) -> float:
        loss, grads = self.grad(*batch)
        self.opt.update(self.drafter, grads)
        mx.eval(self.drafter.parameters(), self.opt.state, loss)
        return float(loss.item())


def _batch(H: np.ndarray, X: np.ndarray, idx: np.ndarray) -> tuple[mx.array, ...]:
    f = lambda a: mx.array(a.astype(np.float32))  # noqa: E731
    return f(H[idx]), f(H[idx + 1]), mx.array(X[idx]), mx.array(X[idx + 1]), mx.array(X[idx + 1]), mx.array(X[idx + 2])


def accuracy(drafter: Drafter, embed: nn.Module, H: np.ndarray, X: np.ndarray, idx: np.ndarray,
             chunk: int = 2048) -> tuple[float, float]:
    """Agreement with the target at chained steps 1 and 2 (held-back rows): what the
    first and the first two drafted tokens of a proposal are accepted at."""
    hit1 = hit2 = 0
    for i in range(0, len(idx), chunk):
        h0, _, x1, _, y1, y2 = _batch(H, X, idx[i : i + chunk])
        d = drafter.chain(embed, h0, x1, 2)  # step 2 chained on its own draft
        ok1 = d[:, 0] == y1
        hit1 += int(ok1.sum().item())
        hit2 += int((ok1 & (d[:, 1] == y2)).sum().item())
    return hit1 / max(1, len(idx)), hit2 / max(1, len(idx))


def say(text: str) -> None:
    print(f"train-drafter: {text}", file=sys.stderr, flush=True)


def _clock(t0: float) -> str:
    return f"{(time.monotonic() - t0) / 60:.1f} min"


def build_prompts(args: argparse.Namespace, tok: Any, rng: random.Random) -> tuple[list[list[list[int]]], dict[str, int]]:
    """The training prompts in the batches the engine decodes them in (--reuse-prefixes:
    the task world's turn-major batches first; the rest shuffled), and how many came
    from each source."""
    reuse = getattr(args, "reuse_prefixes", False)
    world = [] if reuse else world_prompts(tok, args.world_tasks, args.context)
    ordered = turn_major(world_turns(tok, args.world_tasks), args.batch_rows) if reuse else []
    sessions: list[list[int]] = []
    if args.sessions and Path(args.sessions).is_dir():
        sessions = session_prompts(tok, args.sessions, args.context)
        rng.shuffle(sessions)
        sessions = sessions[: args.session_turns]
    else:
        say(f"no public sessions at {args.sessions}: task world and code prompts only")
    code = code_prompts(tok, args.code_prompts, rng)
    general = general_prompts(tok, args.general_prompts, rng)
    counts = {"task_world": len(world) + sum(map(len, ordered)), "public_sessions": len(sessions), "code_and_prose": len(code),
              "general": len(general)}
    # greedy decoding continues equal prompts equally: keep each once
    seen: set[tuple[int, ...]] = set()
    first = []
    for b in ordered:
        b = [p for p in b if not (tuple(p) in seen or seen.add(tuple(p)))]
        if b:
            first.append(b)
    rest = [p for p in {tuple(p): p for p in world + sessions + code + general}.values() if tuple(p) not in seen]
    counts["repeats_dropped"] = sum(counts.values()) - sum(map(len, first)) - len(rest)
    rng.shuffle(rest)
    return first + [rest[i : i + args.batch_rows] for i in range(0, len(rest), args.batch_rows)], counts


def export_prompts(args: argparse.Namespace) -> dict[str, Any]:
    """prompts.npz for training/train_drafter_torch.py: the prompts' tokens, the end-of-turn
    ids, and one prompt's final hidden states and greedy choices from this engine (the
    torch forward must reproduce them before it generates anything)."""
    from jumpahead.engine.engine import Engine, EngineConfig

    rng = random.Random(args.seed)
    engine = Engine.load(args.model, EngineConfig(prefix_cache=False, default_methods=("none",)),
                         progress=lambda s: print(s, file=sys.stderr))
    batches, counts = build_prompts(args, engine.tokenizer, rng)
    prompts = [p for b in batches for p in b]
    ref = max(prompts[:50], key=len)
    hidden = engine.model.model(mx.array(ref)[None])
    argmax = mx.argmax(engine.runner.head(hidden), axis=-1)[0]
    mx.eval(hidden, argmax)
    out = Path(args.export_prompts)
    out.mkdir(parents=True, exist_ok=True)
    eos = sorted({int(t) for t in engine.tokenizer.eos_token_ids})
    # the benchmark's held-out prompts travel apart: the torch script only measures the
    # drafter's agreement on their continuations (never trains on them), so the choice
    # between variants is made on text no training prompt came from
    held = [_ids(engine.tokenizer, [{"role": "user", "content": t}], None, add_generation_prompt=True)
            for t in NOTHING_TO_COPY]
    np.savez_compressed(out / "prompts.npz", tokens=np.concatenate([np.array(p, dtype=np.int32) for p in prompts]),
                        starts=np.cumsum([0] + [len(p) for p in prompts]).astype(np.int64), eos=np.array(eos),
                        heldout_tokens=np.concatenate([np.array(p, dtype=np.int32) for p in held]),
                        heldout_starts=np.cumsum([0] + [len(p) for p in held]).astype(np.int64),
                        ref_tokens=np.array(ref, dtype=np.int32), ref_hidden=np.array(hidden[0].astype(mx.float32)),
                        ref_argmax=np.array(argmax).astype(np.int64), sources=np.array(json.dumps(counts)))
    engine.close()
    return {"out": str(out / "prompts.npz"), "prompts": counts, "tokens": sum(len(p) for p in prompts), "eos": eos}


def import_weights(args: argparse.Namespace) -> dict[str, Any]:
    """A drafter folder (--out) from weights training/train_drafter_torch.py wrote: the
    shapes come from the weights, the fingerprint from the target loaded here."""
    from jumpahead.engine.model.loader import load_model

    weights: dict[str, mx.array] = {}
    for path in args.import_weights:
        weights.update(mx.load(path))
    missing = {"fc.weight", "gate.weight", "head.weight", "d2t"} - set(weights)
    if missing:
        raise ValueError(f"{' '.join(args.import_weights)}: no whole drafter (missing {', '.join(sorted(missing))})")
    model, _, _ = load_model(args.model, progress=lambda s: None)
    dim, ffn, vocab = int(weights["fc.weight"].shape[0]), int(weights["gate.weight"].shape[0]), \
        int(weights["head.weight"].shape[0])
    drafter = Drafter(dim, ffn, vocab)
    drafter.load_weights([(k, v.astype(mx.float32) if v.dtype == mx.float16 else v) for k, v in weights.items()])
    drafter.freeze(keys=["d2t"], recurse=False)
    mx.eval(drafter.parameters())
    names = [Path(p).name for p in args.import_weights]
    training: dict[str, Any] = {"trained_by": "training/train_drafter_torch.py", "weights": names}
    if args.summary:
        summary = json.loads(Path(args.summary).read_text())
        training.update({k: v for k, v in summary.items() if k != "variants"})
        variant = next((v for v in (summary.get("variants") or {}).values()
                        if set(v.get("files") or []) == set(names)), None)
        training["variant"] = variant
        if variant:  # the held-back agreement under the names train() reports it by
            before, after = variant["valid_agreement_before"], variant["valid_agreement"]
            training.update(valid_step1_before=before[0], valid_step1=after[0], valid_steps_1_and_2=after[1])
    out = Path(args.out) if args.out else default_drafter_path()
    drafter.save(out, target_fingerprint(model), {"training": training})
    return {"out": str(out), "dim": dim, "ffn": ffn, "draft_vocab": vocab, "training": training}


def adapter_folder(spec: str | None) -> Path | None:
    """The adapter folder `spec` names (None: none); FileNotFoundError names the problem."""
    if not spec:
        return None
    from jumpahead.engine.model.lora import resolve_adapter

    return resolve_adapter(spec)


def train(args: argparse.Namespace) -> dict[str, Any]:
    from jumpahead.engine.methods.drafter import adapter_drafter_path
    from jumpahead.engine.engine import Engine, EngineConfig

    rng = random.Random(args.seed)
    mx.random.seed(args.seed)
    t0 = time.monotonic()
    adapter = adapter_folder(args.adapter)
    reuse = getattr(args, "reuse_prefixes", False)
    engine = Engine.load(args.model, EngineConfig(prefix_cache=reuse, prefix_cache_ssd=False, max_batch=args.batch_rows,
                                                  default_methods=("none",)),
                         progress=lambda s: print(s, file=sys.stderr),
                         adapter=str(adapter) if adapter else None)
    tok, model = engine.tokenizer, engine.model
    batches, counts = build_prompts(args, tok, rng)
    prompts = [p for b in batches for p in b]
    say(f"{len(prompts)} prompts: " + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items()))

    prog = Progress(len(prompts), 1, label="generate")
    prefill: dict[str, int] = {}
    rows = generate(engine, batches, args.continue_tokens, args.generate_minutes, prog, prefill)
    prog.close()
    engine.close()
    if len(rows) < 4:
        raise ValueError(f"only {len(rows)} continuations in {args.generate_minutes} min: give it more time")
    say(f"{len(rows)} greedy continuations, {sum(len(t) for _, t in rows)} tokens, at {_clock(t0)}")

    n_valid = max(2, len(rows) // 20)
    order = list(range(len(rows)))
    rng.shuffle(order)
    rows = [rows[i] for i in order]
    H = np.concatenate([h for h, _ in rows])
    X = np.concatenate([t for _, t in rows])
    starts = np.cumsum([0] + [len(t) for _, t in rows])
    valid_end = int(starts[n_valid])
    idx = examples(starts)
    valid, train_idx = idx[idx < valid_end], idx[idx >= valid_end]
    d2t = draft_vocab(X[valid_end:], args.draft_vocab)
    t2d = np.full(int(model.model.embed_tokens.weight.shape[0]), -1, dtype=np.int32)
    t2d[d2t] = np.arange(len(d2t), dtype=np.int32)
    covered = float((t2d[X[valid_end:]] >= 0).mean())

    drafter = Drafter(int(H.shape[1]), args.ffn, len(d2t))
    drafter.d2t = mx.array(d2t)
    drafter.freeze(keys=["d2t"], recurse=False)
    embed = model.model.embed_tokens
    drafter.head.weight = embed.weight[mx.array(d2t)].astype(mx.float32)  # start from the target's own rows
    mx.eval(drafter.parameters())

    # steps the time allows, from a short timing run (the cosine schedule needs a length)
    if len(train_idx) == 0:
        raise ValueError("no training examples: give generation more time or more prompts")
    batch = min(args.batch, len(train_idx))
    probe = Trainer(drafter, embed, mx.array(t2d), 0.0, 10)
    tp = time.monotonic()
    for i in range(3):
        probe.step(*_batch(H, X, np.resize(train_idx, (i + 1) * batch)[i * batch :]))
    steps = max(10, int(args.train_minutes * 60 / ((time.monotonic() - tp) / 3)))
    trainer = Trainer(drafter, embed, mx.array(t2d), args.learning_rate, steps)
    before = accuracy(drafter, embed, H, X, valid)
    prog = Progress(steps, 1, label="train")
    losses: list[float] = []
    t_start = time.monotonic()
    shuffled = np.array(train_idx)
    step = 0
    while step < steps:
        np.random.default_rng(args.seed + step).shuffle(shuffled)
        for i in range(0, len(shuffled) - batch + 1, batch):
            if step >= steps:
                break
            losses.append(trainer.step(*_batch(H, X, shuffled[i : i + batch])))
            step += 1
            if step % 20 == 0:
                prog.begin(f"step {step}/{steps} loss {np.mean(losses[-20:]):.3f}")
                prog.advance(20)
            if step % 500 == 0 and not prog.tty:
                say(f"step {step}/{steps}: loss {np.mean(losses[-100:]):.3f} at {_clock(t0)}")
    prog.close()
    after = accuracy(drafter, embed, H, X, valid)
    summary = {
        "prompts": counts, "prefill": prefill,
        "continuations": len(rows), "tokens": int(len(X)), "train_examples": int(len(train_idx)),
        "valid_examples": int(len(valid)), "draft_vocab": len(d2t), "vocab_coverage": round(covered, 4),
        "steps": step, "step_ms": round((time.monotonic() - t_start) / max(step, 1) * 1000, 1),
        "final_loss": round(float(np.mean(losses[-50:])), 4) if losses else None,
        "valid_step1_before": round(before[0], 4), "valid_step1": round(after[0], 4),
        "valid_steps_1_and_2": round(after[1], 4), "minutes": round((time.monotonic() - t0) / 60, 1),
        "args": {k: v for k, v in vars(args).items() if k not in ("func", "command")},
    }
    if adapter is not None:  # the target it learned is the adapted model (the fingerprint covers the base)
        summary["adapter"] = {"name": adapter.name, "digest": engine.info.adapter_digest}
    out = Path(args.out) if args.out else adapter_drafter_path(adapter) if adapter else default_drafter_path()
    drafter.save(out, target_fingerprint(model), {"training": summary})
    summary["out"] = str(out)
    return summary


def run(args: argparse.Namespace) -> int:
    try:
        if args.export_prompts:
            summary = export_prompts(args)
        elif args.import_weights:
            summary = import_weights(args)
        else:
            summary = train(args)
    except (OSError, ValueError) as exc:
        print(f"jumpahead train-drafter: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jumpahead train-drafter", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
