"""Generation mechanics that need no model: stop strings across token boundaries."""

from edgellm.generate import StopMatcher


def feed(m: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = []
    for p in pieces:
        text, hit = m.push(p)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_stop_string_split_across_tokens_is_never_emitted():
    assert feed(StopMatcher(["\nUser:"]), ["Hello", " there", "\n", "Us", "er", ":", " more"]) == (
        "Hello there",
        True,
    )


def test_partial_stop_prefix_is_released_when_it_does_not_complete():
    m = StopMatcher(["END"])
    assert m.push("abcE") == ("abc", False)  # "E" might start END: held back
    assert m.push("x") == ("Ex", False)
    assert m.flush() == ""


def test_earliest_of_several_stop_strings_wins():
    assert feed(StopMatcher(["b", "abc"]), ["xxab", "c"]) == ("xxa", True)


def test_no_stop_strings_passes_text_through():
    m = StopMatcher([])
    assert m.push("abc") == ("abc", False)
    assert m.push("") == ("", False)


def test_stop_at_very_start_yields_empty_text():
    assert feed(StopMatcher(["<"]), ["<tag>"]) == ("", True)


def test_indent_limit_ends_at_a_line_less_indented_keeping_its_indentation():
    from edgellm.generate import IndentLimit

    lim = IndentLimit(4)
    assert lim.push("x = 1\n") == ("x = 1\n", False)  # the first line is never checked
    assert lim.push("    y") == ("    y", False)
    assert lim.push(" = 2\n  ") == (" = 2\n", False)  # indentation held until it is known
    assert lim.push("  z\n") == ("    z\n", False)
    assert lim.push("  w") == ("  ", True)  # two spaces: short; the line's indentation is kept
    blank = IndentLimit(4)
    assert blank.push("a\n\n") == ("a\n", True)  # an empty line is short too, as llama-server's
    tail = IndentLimit(2)
    assert tail.push("a\n\t") == ("a\n", False) and tail.flush() == "\t"
