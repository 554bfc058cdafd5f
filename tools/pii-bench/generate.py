#!/usr/bin/env python3
"""The labelled corpus of `scripts/bench pii`: personal data made by Faker (PyPI `faker`) in
six locales, embedded in sentences of the locale's language, and a negative corpus of text
that must pass untouched (order numbers, timestamps, versions, prices, code, UUIDs, hashes,
invoice ids, prose with capitalised words, product and place names).

Writes one JSON object a line:
  {"id", "corpus": "positive"|"negative", "locale", "seed", "category", "text",
   "values": [{"type", "kind", "value"}]}
`type` is one of email, phone, card, iban, national_id, ipv4, ipv6, name, address; `kind`
names the national id (ssn_us, nino_uk, tax_id_de, nir_fr, id_cn, my_number_jp) or repeats
the type. Negative records have no values. The same seeds give the same file.

National ids that Faker lacks or gets wrong are built from their public specifications with
valid check digits: UK NINO (HMRC's prefix rules; Faker's en_GB gives only the reserved ZZ
prefix), German Steuer-IdNr (ISO 7064 MOD 11,10, one digit repeated), Japanese My Number
(the check digit of the Act on the Use of Numbers). Faker's en_US SSN, fr_FR NIR (with its
key, checked here) and zh_CN resident id are used as they are.

  generate.py [--seeds 1,2,3] [--per-type 15] [--negatives 120] [--out FILE]
"""

import argparse
import hashlib
import json
import random
import sys
import uuid

from faker import Faker

LOCALES = ["en_US", "en_GB", "de_DE", "fr_FR", "zh_CN", "ja_JP"]
TYPES = ["email", "phone", "card", "iban", "national_id", "ipv4", "ipv6", "name", "address"]
NATIONAL_ID = {
    "en_US": "ssn_us",
    "en_GB": "nino_uk",
    "de_DE": "tax_id_de",
    "fr_FR": "nir_fr",
    "zh_CN": "id_cn",
    "ja_JP": "my_number_jp",
}

# What each type is called in each locale's sentences.
LABELS = {
    "en_US": {"email": "email address", "phone": "phone number", "card": "card number",
              "iban": "IBAN", "national_id": "Social Security number", "ipv4": "IP address",
              "ipv6": "IPv6 address", "name": "name", "address": "street address"},
    "en_GB": {"email": "email address", "phone": "phone number", "card": "card number",
              "iban": "IBAN", "national_id": "National Insurance number",
              "ipv4": "IP address", "ipv6": "IPv6 address", "name": "name",
              "address": "address"},
    "de_DE": {"email": "E-Mail-Adresse", "phone": "Telefonnummer", "card": "Kartennummer",
              "iban": "IBAN", "national_id": "Steuer-ID", "ipv4": "IP-Adresse",
              "ipv6": "IPv6-Adresse", "name": "Name", "address": "Anschrift"},
    "fr_FR": {"email": "adresse e-mail", "phone": "numéro de téléphone",
              "card": "numéro de carte", "iban": "IBAN",
              "national_id": "numéro de sécurité sociale", "ipv4": "adresse IP",
              "ipv6": "adresse IPv6", "name": "nom", "address": "adresse"},
    "zh_CN": {"email": "邮箱", "phone": "电话", "card": "银行卡号", "iban": "IBAN账号",
              "national_id": "身份证号", "ipv4": "IP地址", "ipv6": "IPv6地址", "name": "姓名",
              "address": "地址"},
    "ja_JP": {"email": "メールアドレス", "phone": "電話番号", "card": "カード番号",
              "iban": "IBAN", "national_id": "マイナンバー", "ipv4": "IPアドレス",
              "ipv6": "IPv6アドレス", "name": "氏名", "address": "住所"},
}

# Sentences around one value: {v} the value, {l} what it is.
TEMPLATES = {
    "en": [
        "Please update the {l} on file to {v} before Friday.",
        "My {l} is {v}, in case you need it.",
        "{v} is the {l} the customer gave us yesterday.",
        "Can you check whether {v} matches our records?",
        "The form lists {v} as the {l}; is that right?",
        "Forwarding this: {l}: {v} (verified by phone).",
        "Hi team, the new {l} is {v}. Thanks!",
        "We could not reach them at {v}, so I left a note.",
    ],
    "de": [
        "Bitte ändern Sie die {l} in {v} vor Freitag.",
        "Meine {l} lautet {v}, falls Sie sie brauchen.",
        "{v} ist die {l}, die der Kunde gestern angegeben hat.",
        "Können Sie prüfen, ob {v} mit unseren Unterlagen übereinstimmt?",
        "Im Formular steht {v} als {l}, stimmt das?",
        "Zur Info – {l}: {v} (telefonisch bestätigt).",
        "Hallo zusammen, die neue {l} ist {v}. Danke!",
        "Unter {v} haben wir niemanden erreicht.",
    ],
    "fr": [
        "Merci de remplacer ce champ ({l}) par {v} avant vendredi.",
        "{l} : {v}, si jamais vous en avez besoin.",
        "{v}, c'est ce que le client nous a donné hier ({l}).",
        "Pouvez-vous vérifier que {v} correspond à notre dossier ?",
        "Le formulaire indique {v} ({l}) ; est-ce correct ?",
        "Pour info, {l} : {v} (confirmé par téléphone).",
        "Bonjour à tous, nouvelle information ({l}) : {v}. Merci !",
        "Nous n'avons pas pu les joindre via {v}.",
    ],
    "zh": [
        "请在周五之前把{l}改成{v}。",
        "我的{l}是{v}，需要的话请使用。",
        "{v}是客户昨天提供的{l}。",
        "麻烦核对一下{v}是否和系统记录一致？",
        "表格里的{l}写的是{v}，对吗？",
        "转发：{l}：{v}（已电话确认）",
        "大家好，新的{l}是 {v} ，谢谢！",
        "我们通过{v}联系不上对方。",
    ],
    "ja": [
        "金曜日までに{l}を{v}に変更してください。",
        "私の{l}は{v}です。必要であればお使いください。",
        "{v}は昨日お客様から伺った{l}です。",
        "{v}が登録内容と一致しているか確認してもらえますか？",
        "申込書の{l}欄には{v}と書かれていますが、正しいですか？",
        "転送します。{l}：{v}（電話で確認済み）",
        "皆さん、新しい{l}は {v} です。よろしくお願いします。",
        "{v}では連絡が取れませんでした。",
    ],
}

# Several values in one sentence: a name with an e-mail and a phone.
COMBOS = {
    "en": "Contact {name} at {email} or {phone} about the renewal.",
    "de": "Bitte kontaktieren Sie {name} unter {email} oder {phone} wegen der Verlängerung.",
    "fr": "Contactez {name} à {email} ou au {phone} pour le renouvellement.",
    "zh": "续约的事请联系{name}，邮箱{email}，电话{phone}。",
    "ja": "更新の件は{name}さん（{email}、{phone}）までご連絡ください。",
}


def lang(locale):
    return locale.split("_")[0]


def grouped(digits, size, sep=" "):
    return sep.join(digits[i:i + size] for i in range(0, len(digits), size))


def nino(rng):
    """A UK National Insurance number: HMRC's prefix rules, six digits, suffix A-D."""
    first = "ABCEGHJKLMNOPRSTWXYZ"
    second = "ABCEGHJKLMNPRSTWXYZ"
    while True:
        prefix = rng.choice(first) + rng.choice(second)
        if prefix not in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ"):
            break
    digits = "".join(rng.choice("0123456789") for _ in range(6))
    suffix = rng.choice("ABCD")
    if rng.random() < 0.5:
        return f"{prefix}{digits}{suffix}"
    return f"{prefix} {digits[0:2]} {digits[2:4]} {digits[4:6]} {suffix}"


def tax_id_de_check(first10):
    """ISO 7064 MOD 11,10 check digit of a Steuer-IdNr's first ten digits."""
    product = 10
    for c in first10:
        total = (int(c) + product) % 10
        if total == 0:
            total = 10
        product = (total * 2) % 11
    check = 11 - product
    return 0 if check == 10 else check


def tax_id_de(rng):
    """A German tax id: first digit not 0; among the first ten one digit occurs twice, eight
    others once (one digit missing); then the check digit."""
    while True:
        digits = rng.sample("0123456789", 9)
        digits.append(rng.choice(digits))
        rng.shuffle(digits)
        if digits[0] != "0":
            break
    first10 = "".join(digits)
    number = first10 + str(tax_id_de_check(first10))
    if rng.random() < 0.5:
        return number
    return f"{number[0:2]} {number[2:5]} {number[5:8]} {number[8:11]}"


def my_number_check(first11):
    """The check digit of a Japanese individual number (My Number)."""
    total = 0
    for n in range(1, 12):
        p = int(first11[11 - n])
        q = n + 1 if n <= 6 else n - 5
        total += p * q
    r = total % 11
    return 0 if r <= 1 else 11 - r


def my_number_jp(rng):
    first11 = "".join(rng.choice("0123456789") for _ in range(11))
    number = first11 + str(my_number_check(first11))
    if rng.random() < 0.5:
        return number
    return grouped(number, 4, rng.choice([" ", "-"]))


def nir_fr(fake, rng):
    """Faker's NIR (15 digits, key = 97 - number mod 97), checked, sometimes spaced."""
    nir = fake.ssn()
    # Corsica's departments 2A and 2B count as 19 and 18 in the key
    number = int(nir[:13].replace("2A", "19").replace("2B", "18"))
    assert len(nir) == 15 and 97 - number % 97 == int(nir[13:]), nir
    if rng.random() < 0.5:
        return nir
    return f"{nir[0]} {nir[1:3]} {nir[3:5]} {nir[5:7]} {nir[7:10]} {nir[10:13]} {nir[13:15]}"


def national_id(locale, fake, rng):
    if locale == "en_GB":
        return nino(rng)
    if locale == "de_DE":
        return tax_id_de(rng)
    if locale == "fr_FR":
        return nir_fr(fake, rng)
    if locale == "ja_JP":
        return my_number_jp(rng)
    return fake.ssn()  # en_US SSN, zh_CN resident id


def card(fake, rng):
    number = fake.credit_card_number()
    style = rng.random()
    if style < 0.4:
        return number
    if style < 0.8:
        return grouped(number, 4, " ")
    return grouped(number, 4, "-")


def iban(fake, rng):
    value = fake.iban()
    return grouped(value, 4, " ") if rng.random() < 0.5 else value


def address(locale, fake, rng):
    if locale == "ja_JP":
        return f"{fake.city()}{fake.town()}{fake.chome()}{fake.ban()}{fake.gou()}"
    if locale == "zh_CN":
        return f"{fake.city()}{fake.street_name()}{rng.randint(1, 999)}号"
    return fake.street_address().replace("\n", ", ")


def value_of(kind, locale, fake, rng):
    if kind == "email":
        return fake.email()
    if kind == "phone":
        return fake.phone_number()
    if kind == "card":
        return card(fake, rng)
    if kind == "iban":
        return iban(fake, rng)
    if kind == "national_id":
        return national_id(locale, fake, rng)
    if kind == "ipv4":
        return fake.ipv4()
    if kind == "ipv6":
        return fake.ipv6()
    if kind == "name":
        return fake.name()
    if kind == "address":
        return address(locale, fake, rng)
    raise ValueError(kind)


def positives(locale, seed, per_type):
    fake = Faker(locale)
    fake.seed_instance(seed)
    rng = random.Random(f"{locale}/{seed}")
    templates = TEMPLATES[lang(locale)]
    labels = LABELS[locale]
    for kind in TYPES:
        for i in range(per_type):
            value = value_of(kind, locale, fake, rng)
            text = templates[(i + seed) % len(templates)].format(v=value, l=labels[kind])
            sub = NATIONAL_ID[locale] if kind == "national_id" else kind
            yield {"id": f"{locale}/{seed}/{kind}/{i}", "corpus": "positive", "locale": locale,
                   "seed": seed, "category": sub, "text": text,
                   "values": [{"type": kind, "kind": sub, "value": value}]}
    for i in range(per_type // 3):
        values = {"name": fake.name(), "email": fake.email(), "phone": fake.phone_number()}
        yield {"id": f"{locale}/{seed}/combo/{i}", "corpus": "positive", "locale": locale,
               "seed": seed, "category": "combo",
               "text": COMBOS[lang(locale)].format(**values),
               "values": [{"type": t, "kind": t, "value": v} for t, v in values.items()]}


PRODUCTS = ["iPhone 15 Pro", "Galaxy S24 Ultra", "ThinkPad X1 Carbon", "PlayStation 5",
            "Kindle Paperwhite", "Model Y", "Surface Laptop 6", "AirPods Pro",
            "Pixel 8a", "Raspberry Pi 5", "Microsoft Teams", "Google Sheets"]
PLACES = ["Golden Gate Bridge", "Mount Fuji", "Lake Geneva", "Brandenburg Gate",
          "Eiffel Tower", "Great Wall", "Central Park", "Tower Bridge", "Shinjuku Station",
          "Rue de Rivoli", "Alexanderplatz", "Pudong Airport"]
PROSE = [
    "The Quarterly Review Board met in {place} to discuss the {product} launch.",
    "After the Annual General Meeting, Finance and Legal signed off on the Budget.",
    "Our Customer Success team will demo {product} at the Berlin Developer Summit.",
    "The Northern Region outperformed the Southern Region in Q3, according to Sales Ops.",
    "Please read the Terms of Service and the Privacy Policy before Monday.",
    "The train from {place} to the Old Town leaves every Tuesday and Thursday.",
    "Project Phoenix and Project Atlas share the same Release Calendar this Spring.",
    "Der Vorstand hat das Budget für {product} im Werk Nord freigegeben.",
    "La Direction Générale présentera le Plan Stratégique à {place} en Juin.",
    "年度总结会议将在{place}举行，主题是{product}的推广计划。",
    "来週の全社会議では{product}の販売計画について話し合います。",
    "Die Geschäftsführung bittet alle Mitarbeiter, die Reisekostenabrechnung bis Montag "
    "einzureichen.",
    "Read The Old Man and the Sea before the Book Club meets at {place}.",
    "Apple Watch Series 9 and Galaxy Buds Live ship with the Spring Update.",
    "Le Conseil d'Administration se réunira salle Victor Hugo, au 3e étage.",
    "请到第3号会议室参加{product}评审，会议由市场部主持。",
    "第2会議室は3階です。{product}の資料を持ってきてください。",
    "Park in Lot 4 near Gate 12, then take Line 2 to {place}.",
]
CODE = [
    "for (let i = 0; i < items.length; i++) { total += items[i].price * 1.19; }",
    "fn main() { let v: Vec<u32> = (1..=255).collect(); println!(\"{}\", v.len()); }",
    "SELECT id, created_at FROM orders WHERE total > 1000 AND status = 'paid' LIMIT 50;",
    "if err := srv.ListenAndServe(\":8080\"); err != nil { log.Fatal(err) }",
    "def area(r):\n    return 3.14159265358979 * r ** 2",
    "docker run -p 5432:5432 -e POSTGRES_DB=app postgres:16.2",
    "git commit -m \"fix retry budget\" && git push origin release/2024.11",
    "const TIMEOUT_MS = 30000; const RETRIES = 3; export default { TIMEOUT_MS, RETRIES };",
]


def negatives(seed, count):
    rng = random.Random(f"negative/{seed}")
    fake = Faker("en_US")
    fake.seed_instance(seed)

    def date():
        return fake.date_time_between(start_date="-5y", end_date="+1y")

    makers = {
        "order_number": lambda: rng.choice([
            f"Order #{rng.randint(100000, 99999999)} has shipped.",
            f"Your order {rng.choice('ABCDEFGH')}-{rng.randint(2019, 2026)}-"
            f"{rng.randint(100000, 999999)} is ready for pickup.",
            f"Bestellnummer {rng.randint(10**9, 10**10 - 1)} wurde storniert.",
            f"订单号 {rng.randint(10**11, 10**12 - 1)} 已发货。",
            f"Tracking {rng.randint(1000, 9999)} {rng.randint(1000, 9999)} "
            f"{rng.randint(1000, 9999)} is in transit.",
        ]),
        "timestamp": lambda: rng.choice([
            f"The job finished at {date().isoformat()}Z.",
            f"Meeting moved to {date().strftime('%d/%m/%Y %H:%M')}.",
            f"Logged {date().strftime('%Y-%m-%d %H:%M:%S')} UTC, epoch {rng.randint(10**9, 2 * 10**9)}.",
            f"Termin am {date().strftime('%d.%m.%Y')} um {date().strftime('%H:%M')} Uhr.",
            f"会议时间：{date().strftime('%Y年%m月%d日 %H:%M')}",
        ]),
        "version": lambda: rng.choice([
            f"Upgrade to v{rng.randint(1, 20)}.{rng.randint(0, 40)}.{rng.randint(0, 99)} today.",
            f"Build {rng.randint(1, 12)}.{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 9999)} fixes the crash.",
            f"Requires Python {rng.randint(3, 3)}.{rng.randint(8, 13)} and numpy>={rng.randint(1, 2)}.{rng.randint(0, 26)}.",
            f"Kernel 6.{rng.randint(1, 12)}.{rng.randint(0, 80)}-{rng.randint(1, 200)}-generic is installed.",
        ]),
        "price": lambda: rng.choice([
            f"The total is ${rng.randint(1, 9)},{rng.randint(100, 999)}.{rng.randint(10, 99)} incl. tax.",
            f"Preis: {rng.randint(1, 999)},{rng.randint(10, 99)} € pro Monat.",
            f"Prix : {rng.randint(1, 99)} {rng.randint(100, 999)},{rng.randint(10, 99)} € TTC.",
            f"价格：¥{rng.randint(1, 99)},{rng.randint(100, 999)}",
            f"月額 {rng.randint(1, 99)},{rng.randint(100, 999)}円（税込）",
        ]),
        "code": lambda: rng.choice(CODE),
        "uuid": lambda: f"Request {uuid.UUID(int=rng.getrandbits(128), version=4)} was retried.",
        "hash": lambda: rng.choice([
            f"Commit {hashlib.sha1(str(rng.random()).encode()).hexdigest()} reverted the change.",
            f"sha256: {hashlib.sha256(str(rng.random()).encode()).hexdigest()}",
            f"ETag \"{hashlib.md5(str(rng.random()).encode()).hexdigest()}\" matched.",
        ]),
        "invoice": lambda: rng.choice([
            f"Invoice INV-{rng.randint(2019, 2026)}-{rng.randint(0, 999999):06d} is overdue.",
            f"Rechnung Nr. {rng.randint(2019, 2026)}/{rng.randint(1000, 99999)} liegt bei.",
            f"Facture n° FA{rng.randint(10**7, 10**8 - 1)} réglée.",
        ]),
        "prose": lambda: rng.choice(PROSE).format(place=rng.choice(PLACES),
                                                  product=rng.choice(PRODUCTS)),
        "product_place": lambda: rng.choice([
            f"The {rng.choice(PRODUCTS)} is on sale near {rng.choice(PLACES)}.",
            f"We shipped {rng.randint(2, 500)} units of {rng.choice(PRODUCTS)} to {fake.city()}.",
            f"Flights to {fake.city()} via {rng.choice(PLACES)} are delayed.",
        ]),
    }
    names = list(makers)
    for i in range(count):
        category = names[i % len(names)]
        yield {"id": f"negative/{seed}/{category}/{i}", "corpus": "negative", "locale": "any",
               "seed": seed, "category": category, "text": makers[category](), "values": []}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--per-type", type=int, default=15)
    parser.add_argument("--negatives", type=int, default=200)
    parser.add_argument("--out", default="-")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")
    for seed in seeds:
        for locale in LOCALES:
            for record in positives(locale, seed, args.per_type):
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        for record in negatives(seed, args.negatives):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
