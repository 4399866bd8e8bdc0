"""Text for a KerasHub causal LM, tokenized by the preset's own preprocessor in tf.data.

The built-in examples (`builtin_examples`) are prompt/response pairs of small sums and differences ("what is 3 plus
4 ?" -> "7"), made here: the offline default of the LoRA recipes, as digits is the CNN recipe's.
"""

from __future__ import annotations

NUMBERS = range(10)


def builtin_examples() -> list[tuple[str, str]]:
    """(prompt, response) pairs: every `a plus b` and `a minus b` (a >= b) for single digits, in a fixed order."""
    examples = []
    for a in NUMBERS:
        for b in NUMBERS:
            examples.append((f"what is {a} plus {b} ?", str(a + b)))
            if a >= b:
                examples.append((f"what is {a} minus {b} ?", str(a - b)))
    return examples


def builtin_texts() -> list[str]:
    """Every prompt and response of `builtin_examples`, one string each (what a tiny preset's vocabulary covers)."""
    return [text for pair in builtin_examples() for text in pair]
