"""agent_tools.py: the tools, names and values of the demo model's agent data (tools/python/agent_data.py).

Training tools are mostly generated: a verb and a noun make the name (`check_tide`, `fetch_opening_hours`), the
request states the noun and the argument values, and values come from pools far larger than what a 2.9 M-parameter
model can memorise, so the only way to the right call is to find the declared tool the request names and copy the
values out of the request: what a held-out tool needs. A dozen hand-written tools add realistic phrasings. The
held-out split has its own tools (none of their names, nouns or values is generated for training), cities and
people, and phrasings of its own that still name what they ask for, as a user of any model does.
"""
import random
import re
from dataclasses import dataclass, field

TRAIN, HELD_OUT = "train", "held_out"

CITIES = {TRAIN: ["Bath", "London", "Paris", "Rome", "York", "Leeds", "Oxford", "Dublin", "Berlin", "Madrid",
                  "Vienna", "Lisbon", "Brighton", "Cambridge", "Bristol", "Derby", "Chester", "Exeter", "Norwich",
                  "Durham", "Glasgow", "Cardiff", "Prague", "Oslo", "Tokyo", "Boston", "Denver", "Cairo", "Lima",
                  "Quebec", "Athens", "Milan", "Zurich", "Geneva", "Warsaw", "Munich", "Seville", "Porto", "Nice",
                  "Lyon", "Kyoto", "Delhi", "Sydney", "Perth", "Chicago", "Dallas", "Austin", "Toronto"],
          HELD_OUT: ["Winchester", "Salisbury", "Florence", "Naples", "Bergen", "Helsinki", "Krakow", "Seattle",
                     "Osaka", "Hobart", "Valencia", "Antwerp", "Bruges", "Leicester", "Truro", "Inverness"]}
FIRST = {TRAIN: ["Anne", "Emma", "Fanny", "Elinor", "Jane", "Harriet", "Frank", "Henry", "Lucy", "John", "Robert",
                 "Mary", "Edward", "Charles", "Louisa", "Tom", "Kitty", "Maria", "Isabella", "George", "Alice", "Peter",
                 "Sarah", "David", "Laura", "James", "Emily", "Thomas", "Susan", "Mark", "Julia", "Anthony", "Grace",
                 "Arthur", "Nora", "Walter", "Rose", "Philip", "Lydia", "Martin"],
         HELD_OUT: ["Caroline", "William", "Eleanor", "Oliver", "Rachel", "Simon", "Clara", "Daniel", "Hannah",
                    "Victor"]}
LAST = {TRAIN: ["Elliot", "Woodhouse", "Price", "Dashwood", "Bennet", "Smith", "Churchill", "Tilney", "Steele",
                "Thorpe", "Martin", "Crawford", "Ferrars", "Musgrove", "Grove", "Bertram", "Lucas", "Knight", "Brown",
                "Hall", "Jones", "Clark", "King", "Wood", "Stone", "Lee", "Hart", "Bell", "Morland", "Palmer",
                "Weston", "Bates", "Collins", "Darcy", "Harville", "Russell", "Yates", "Norris"],
        HELD_OUT: ["Bingley", "Ward", "Grant", "Moss", "Ashby", "Hughes", "Frost", "Reed", "Lang", "Fairfax"]}
WORDS = {TRAIN: ["pride", "letter", "garden", "carriage", "music", "dance", "fortune", "marriage", "friend",
                 "sister", "evening", "ball", "visit", "book", "heart", "walk", "dinner", "house", "river", "window",
                 "horse", "winter", "summer", "ribbon", "shawl", "novel", "church", "bridge", "meadow", "cottage"],
         HELD_OUT: ["bonnet", "orchard", "piano", "voyage", "harvest", "candle"]}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
COLOURS = ["red", "blue", "green", "yellow", "black", "white"]
SYLLABLES = ["ar", "bel", "cor", "dan", "el", "fen", "gar", "hol", "is", "kel", "lan", "mor", "nor", "or", "pen",
             "quin", "ros", "sel", "tor", "ul", "ven", "wyn"]


# The share of training cities and people that are invented names, so that no value can simply be remembered
# (train_tiny_agent.py prepare --invented-share).
INVENTED_SHARE = {"city": 0.4, "person": 0.0}
# What invented names are made of: the syllables above, or (use_pieces) the tokenizer's own word pieces. A model
# trained to copy names of 22 syllables learns to copy those tokens only (measured: train loss 0.01, held-out names
# still wrong); names of any piece teach it to copy whatever the request holds.
PIECES = []


def use_pieces(vocab):
    """Invent names from the tokenizer's lowercase word pieces of 2-5 letters (vocab: token -> id)."""
    PIECES[:] = sorted(p for p in vocab if 2 <= len(p) <= 5 and p.isascii() and p.isalpha() and p.islower())


# Capitalised whole-word tokens (`Catherine`, `Barton`) an invented name's word may be, and the share of words that
# are (train_tiny_agent.py prepare --capital-names). Pieces alone never teach copying a name that is one token:
# held-out `Eleanor` was written `Frost`, `who Eleanor`, `Sughes`.
CAPITALS = []
CAPITAL_SHARE = 0.0


def use_capitals(vocab):
    """Take name words from the tokenizer's capitalised word tokens of 3 letters or more, but for held-out names."""
    held = set(CITIES[HELD_OUT] + FIRST[HELD_OUT] + LAST[HELD_OUT])
    CAPITALS[:] = sorted(p for p in vocab if len(p) >= 3 and p.isascii() and p.isalpha() and p[0].isupper()
                         and p[1:].islower() and p not in held)


def invented(rng):
    if CAPITAL_SHARE and rng.random() < CAPITAL_SHARE:
        return rng.choice(CAPITALS)
    parts = PIECES or SYLLABLES
    return "".join(rng.choice(parts) for _ in range(rng.randint(1 if PIECES else 2, 3))).capitalize()


# The share of generated training tools named by an invented word (a lookup's noun, an action's object, an arithmetic
# operation: train_tiny_agent.py prepare --invented-tools). With the names above only, the model wrote memorised tool
# names for held-out tools (get_population, subtract); a name that never repeats can only be written by copying it
# from the declarations, as a held-out tool's must be.
INVENTED_TOOL_SHARE = 0.0
# Never invented: the held-out tools' words, and the phrasings' own format fields.
NOT_INVENTED = {"population", "subtract", "recipe", "dish", "call", "person", "servings", "video",
                "noun", "verb", "obj", "count", "target", "result", "status"}


def invented_word(rng):
    """A lowercase invented word that no held-out tool or phrasing uses."""
    while True:
        w = invented(rng).lower()
        if w not in NOT_INVENTED:
            return w


def or_invented(rng, word, share):
    """`word`, or with probability `share` an invented one. Tool names' nouns take the invented-tool share; verbs and
    parameter names half of it, as a held-out call must copy them from the declaration too (measured:
    `lookup_population` for `get_population`, `first` for `a`)."""
    return invented_word(rng) if rng.random() < share else word


def city(rng, split):
    """A city; in training also an invented place name."""
    if split == TRAIN and rng.random() < INVENTED_SHARE["city"]:
        return invented(rng)
    return rng.choice(CITIES[split])


def person(rng, split):
    """A person's name; in training also an invented one."""
    if split == TRAIN and rng.random() < INVENTED_SHARE["person"]:
        return f"{invented(rng)} {invented(rng)}"
    return f"{rng.choice(FIRST[split])} {rng.choice(LAST[split])}"


# Held-out dishes (find_recipe's values): lowercase common words, never a training value.
DISHES = ["soup", "pie", "bread", "cake", "stew", "pudding"]
# Lowercase words of the prose a training word value may be (use_words), and the share of word values taken from
# them (train_tiny_agent.py prepare --prose-words): with the 30 words above only, the model copied capitalised names
# and codes but not a held-out lowercase value (`scip` for `soup`, `pciding` for `pudding`).
PROSE_WORDS = []
PROSE_WORD_SHARE = 0.0


def use_words(text):
    """Take word values from `text`'s lowercase words of 3-9 letters, but for any held-out value or format word."""
    held = set(WORDS[HELD_OUT] + DISHES) | NOT_INVENTED
    PROSE_WORDS[:] = sorted({w for w in re.findall(r"\b[a-z]{3,9}\b", text)} - held)


def word(rng, split):
    if split == TRAIN and PROSE_WORD_SHARE and rng.random() < PROSE_WORD_SHARE:
        return rng.choice(PROSE_WORDS)
    return rng.choice(WORDS[split])


def code(rng, split):
    return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(rng.randint(2, 4)))


def s(desc, enum=None):
    out = {"type": "string", "description": desc}
    if enum:
        out["enum"] = enum
    return out


def i(desc):
    return {"type": "integer", "description": desc}


def n(desc):
    return {"type": "number", "description": desc}


def b(desc):
    return {"type": "boolean", "description": desc}


@dataclass
class Tool:
    name: str
    description: str
    properties: dict
    required: list
    asks: list                 # request phrasings: format fields are argument names
    args: object               # rng -> argument dict (the values the request states)
    result: object             # (rng, args) -> the tool's result (a dict)
    answers: list              # answer phrasings over args and result fields
    pair_asks: list = field(default_factory=list)  # two calls in one request: fields a1 (first args), a2 (second)
    sibling: object = None     # rng -> a tool differing from this one in one word of its name (a hard distractor)

    def openai(self):
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": self.properties, "required": self.required}}}


# --------------------------------------------------------------------------------------------------- generated
LOOKUP_NOUNS = ["weather", "time", "price", "score", "news", "forecast", "distance", "exchange rate", "address",
                "phone number", "opening hours", "rating", "temperature", "humidity", "currency", "timezone",
                "balance", "status", "schedule", "menu", "traffic", "tide", "sunrise", "sunset", "elevation", "area",
                "postcode", "mayor", "founder", "author", "meaning", "spelling", "synonym", "rhyme", "definition",
                "reviews", "fare", "delay", "platform", "departure time", "arrival time", "library hours",
                "air quality", "rainfall", "wind speed", "moon phase", "ticket price", "age", "email address",
                "birthday", "job title", "office", "manager", "height"]
LOOKUP_VERBS = ["get", "find", "check", "lookup", "fetch", "show"]
# (value maker, parameter names, the noun that names the value in a description)
KEYS = {"city": (city, ["city", "location", "place", "town"], "place"),
        "person": (person, ["name", "person", "contact", "who"], "person"),
        "word": (word, ["word", "term", "query", "topic"], "word"),
        "code": (code, ["code", "symbol", "id", "ref"], "code")}
NOUN_KEYS = {"age": "person", "email address": "person", "birthday": "person", "job title": "person",
             "office": "person", "manager": "person", "height": "person", "meaning": "word", "spelling": "word",
             "synonym": "word", "rhyme": "word", "definition": "word", "price": "code", "balance": "code",
             "status": "code", "platform": "code", "delay": "code", "fare": "code", "score": "code"}
LOOKUP_ASKS = ["What is the {noun} of {v}?", "What is the {noun} for {v}?", "{Verb} the {noun} for {v}.",
               "Can you {verb} the {noun} of {v}?", "Tell me the {noun} for {v}.", "I need the {noun} of {v}.",
               "{Noun} for {v}?", "Please {verb} the {noun} for {v}.", "What's the {noun} in {v}?"]
LOOKUP_PAIRS = ["What is the {noun} of {v1} and of {v2}?", "{Verb} the {noun} for {v1} and for {v2}.",
                "I need the {noun} for {v1} and {v2}."]
LOOKUP_ANSWERS = ["The {noun} of {v} is {r}.", "The {noun} for {v} is {r}.", "{v}: the {noun} is {r}."]
ACTIONS = [("order", "ticket"), ("send", "parcel"), ("reserve", "seat"), ("buy", "stamp"), ("print", "copy"),
           ("book", "room"), ("request", "taxi"), ("order", "pizza"), ("send", "invitation"), ("buy", "ticket"),
           ("deliver", "letter"), ("rent", "bicycle"), ("order", "book"), ("book", "lesson")]
COUNT_NAMES = ["count", "number", "quantity", "amount"]
ACTION_ASKS = ["{Verb} {count} {obj}s for {target}.", "Please {verb} {count} {obj}s for {target}.",
               "I want to {verb} {count} {obj}s for {target}.", "{Verb} {target} {count} {obj}s."]
EXTRAS = [("unit", s("Unit of the answer", ["metric", "imperial"])), ("limit", i("Most results to return")),
          ("verbose", b("Give more detail")), ("language", s("Answer language", ["English", "French"])),
          ("options", {"type": "object", "description": "Extra options",
                       "properties": {"fast": b("Prefer speed"), "max_age": i("Oldest result in days")}})]
OPS = [("add", "plus", lambda a, b_: a + b_), ("multiply", "times", lambda a, b_: a * b_),
       ("max", "or", max), ("min", "or", min)]


def cap(text):
    return text[:1].upper() + text[1:]


STATUSES = ["done", "queued", "sent", "confirmed", "pending", "failed"]


def result_value(r):
    """A lookup's result: numbers of up to six digits, decimals, words, invented words. With four-digit numbers and
    a few words only, answers about held-out results cut six-digit populations to four digits and missed a status
    no training result had ("ringing"): the answer must copy whatever the tool returned."""
    return r.choice([r.randint(1, 9999), r.randint(10000, 999999), round(r.uniform(0, 100), 1),
                     r.choice(WORDS[TRAIN]), invented_word(r)])


def extras(rng, properties):
    for name, schema in rng.sample(EXTRAS, rng.randint(0, 2)):
        properties.setdefault(name, schema)
    return properties


def lookup_tool(rng, verb=None, key=None, param=None):
    """A lookup (`check_tide(city)`); given a verb, a key and a parameter, one more with another noun: its
    sibling, which only the noun tells apart."""
    noun = or_invented(rng, rng.choice(LOOKUP_NOUNS), INVENTED_TOOL_SHARE)
    verb = verb or or_invented(rng, rng.choice(LOOKUP_VERBS), INVENTED_TOOL_SHARE / 2)
    if not key and PROSE_WORD_SHARE and rng.random() < PROSE_WORD_SHARE / 2:
        key = "word"  # a lookup of a lowercase word's noun (`find_tide(topic)` for "Find the tide for meadow.")
    key = key or NOUN_KEYS.get(noun) or rng.choice(["city", "city", "code"])
    make, names, what = KEYS[key]
    param = param or or_invented(rng, rng.choice(names), INVENTED_TOOL_SHARE / 2)
    words = {"noun": noun, "Noun": cap(noun), "verb": "look up" if verb == "lookup" else verb}
    words["Verb"] = cap(words["verb"])
    asks = [a.replace("{v}", "{" + param + "}").format(**words, **{param: "{" + param + "}"}) for a in LOOKUP_ASKS]
    pairs = [a.replace("{v1}", "{a1[" + param + "]}").replace("{v2}", "{a2[" + param + "]}")
             .replace("{noun}", noun).replace("{Verb}", words["Verb"]) for a in LOOKUP_PAIRS]
    result_key = noun.replace(" ", "_")
    answers = [a.replace("{v}", "{" + param + "}").replace("{r}", "{" + result_key + "}").replace("{noun}", noun)
               for a in LOOKUP_ANSWERS]
    return Tool(f"{verb}_{noun.replace(' ', '_')}", f"{cap(words['verb'])} the {noun} of a {what}",
                extras(rng, {param: s(f"The {what}")}), [param], asks,
                lambda r, split=TRAIN: {param: make(r, split)},
                lambda r, a: {result_key: result_value(r)},
                answers, pair_asks=pairs, sibling=lambda r: lookup_tool(r, verb, key, param))


def action_tool(rng):
    verb, obj = rng.choice(ACTIONS)
    obj = or_invented(rng, obj, INVENTED_TOOL_SHARE)
    count_name = or_invented(rng, rng.choice(COUNT_NAMES), INVENTED_TOOL_SHARE / 2)
    target_name = or_invented(rng, rng.choice(["name", "recipient", "person", "customer"]), INVENTED_TOOL_SHARE / 2)
    while target_name == count_name:
        target_name = invented_word(rng)
    words = {"verb": verb, "Verb": cap(verb), "obj": obj}
    asks = [a.format(**words, count="{" + count_name + "}", target="{" + target_name + "}") for a in ACTION_ASKS]
    return Tool(f"{verb}_{obj}", f"{cap(verb)} {obj}s for a person",
                extras(rng, {target_name: s("Who it is for"), count_name: i(f"How many {obj}s")}),
                [target_name, count_name], asks,
                lambda r: {target_name: person(r, TRAIN), count_name: r.randint(1, 20)},
                lambda r, a: {"status": r.choice(STATUSES) if r.random() < 0.5 else invented_word(r)},
                [f"{{{count_name}}} {obj}s for {{{target_name}}}: {{status}}.",
                 f"Your {obj}s for {{{target_name}}}: {{status}}."])


PERSON_VERBS = ["notify", "invite", "email", "visit", "remind", "thank", "message", "greet", "text", "page", "meet",
                "warn", "ask", "pay", "follow", "help", "praise", "introduce", "wake", "find"]
PERSON_NOUNS = ["person", "contact", "friend", "guest", "user", "member", "client"]
PERSON_ASKS = ["{Verb} {t}, please.", "Could you {verb} {t}?", "I want you to {verb} {t}.", "{Verb} {t} for me.",
               "Can you {verb} {t} today?", "Go and {verb} {t}."]


def person_tool(rng, noun=None, param=None):
    """An action on a person named by its verb alone (`notify_contact(name)`: the request says "Notify Anne
    Elliot.", never the noun), so the request's verb is the cue to the tool; given a noun and a parameter, one more
    with another verb: its sibling. Without these the model chose another declared tool for a held-out person's
    call ("Call Clara Ward." -> fetch_platform), and copied names after a capitalised verb badly."""
    verb = or_invented(rng, rng.choice(PERSON_VERBS), INVENTED_TOOL_SHARE / 2)
    noun = noun or rng.choice(PERSON_NOUNS)
    param = param or or_invented(rng, rng.choice(KEYS["person"][1]), INVENTED_TOOL_SHARE / 2)
    words = {"verb": verb, "Verb": cap(verb), "t": "{" + param + "}"}
    return Tool(f"{verb}_{noun}", f"{cap(verb)} a {noun}", extras(rng, {param: s(f"The {noun}")}), [param],
                [a.format(**words) for a in PERSON_ASKS], lambda r: {param: person(r, TRAIN)},
                lambda r, a: {"status": r.choice(STATUSES) if r.random() < 0.5 else invented_word(r)},
                [f"{cap(verb)} {{{param}}}: {{status}}.", f"{{{param}}}: {{status}}."],
                sibling=lambda r: person_tool(r, noun, param))


# Arithmetic operands with each length of 1-3 digits as likely (train_tiny_agent.py prepare --even-digits), not
# 0-999 evenly: with nine in ten of three digits the model wrote a held-out two-digit operand with a third digit
# (58 -> 587).
EVEN_DIGITS = False


def operand(rng):
    if not EVEN_DIGITS:
        return rng.randint(0, 999)
    digits = rng.randint(1, 3)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)


def arithmetic_tool(rng):
    op, word_, fn = rng.choice(OPS)
    op = or_invented(rng, op, INVENTED_TOOL_SHARE)  # an invented operation: the result comes from the tool
    pair = rng.choice([("a", "b"), ("x", "y"), ("first", "second"), ("left", "right")])
    first, second = (or_invented(rng, w, INVENTED_TOOL_SHARE / 2) for w in pair)
    while second == first:
        second = invented_word(rng)
    name = rng.choice([op, f"{op}_numbers", f"{op}_two"])
    asks = [f"{op} {{{first}}} and {{{second}}}", f"Please {op} {{{first}}} and {{{second}}}.",
            f"{cap(op)} {{{first}}} and {{{second}}}.", f"Use {op} on {{{first}}} and {{{second}}}."]
    if op in ("add", "multiply"):
        asks.append(f"What is {{{first}}} {word_} {{{second}}}?")
    return Tool(name, f"{cap(op)} two integers", {first: i("The first number"), second: i("The second number")},
                [first, second], asks, lambda r: {first: operand(r), second: operand(r)},
                lambda r, a: {"result": fn(a[first], a[second])},
                [f"The result is {{result}}.", f"{cap(op)} of {{{first}}} and {{{second}}} is {{result}}."])


# The share of generated training tools that are person_tool's, and of calls declared beside their sibling
# (train_tiny_agent.py prepare --person-tools, --siblings; 0 draws nothing, so held-out examples stay the same).
PERSON_TOOL_SHARE = 0.0
SIBLING_SHARE = 0.0


def generated_tool(rng):
    if PERSON_TOOL_SHARE and rng.random() < PERSON_TOOL_SHARE:
        return person_tool(rng)
    x = rng.random()
    return lookup_tool(rng) if x < 0.6 else action_tool(rng) if x < 0.8 else arithmetic_tool(rng)


# --------------------------------------------------------------------------------------------------- hand-written
def fixed_tools(split):
    """Hand-written tools with phrasings of their own (held-out: the evaluation's tools)."""
    def sp(f):  # bind the split into an argument maker
        return lambda rng: f(rng, split)
    if split == HELD_OUT:
        return [
            Tool("get_population", "Get the population of a city", {"city": s("The city name")}, ["city"],
                 ["What is the population of {city}?", "Look up the population of {city}."],
                 sp(lambda rng, sp_: {"city": city(rng, sp_)}),
                 lambda rng, a: {"population": rng.randint(10000, 900000)},
                 ["The population of {city} is {population}."]),
            Tool("subtract", "Subtract one integer from another",
                 {"a": i("The number to subtract from"), "b": i("The number to subtract")}, ["a", "b"],
                 ["subtract {a} and {b}", "Please subtract {a} and {b}."],
                 lambda rng: {"a": rng.randint(100, 999), "b": rng.randint(0, 99)},
                 lambda rng, a: {"result": a["a"] - a["b"]}, ["The result is {result}."]),
            Tool("find_recipe", "Find a recipe for a dish",
                 {"dish": s("The dish"), "servings": i("How many servings")}, ["dish"],
                 ["Find a recipe for {dish}.", "I need the recipe for {dish}."],
                 lambda rng: {"dish": rng.choice(DISHES)},
                 lambda rng, a: {"minutes": rng.randint(10, 120)}, ["The recipe for {dish} takes {minutes} minutes."]),
            Tool("call_person", "Phone a person", {"name": s("Who to call"), "video": b("A video call")}, ["name"],
                 ["Call {name}.", "Please call {name} now."],
                 sp(lambda rng, sp_: {"name": person(rng, sp_)}),
                 lambda rng, a: {"status": "ringing"}, ["Calling {name}: ringing."]),
        ]
    weather = lambda rng: {"forecast": rng.choice(["sunny", "rainy", "cloudy", "windy", "snowy"]),  # noqa: E731
                           "temperature": rng.randint(-5, 35)}
    return [
        Tool("get_weather", "Get the current weather in a city",
             {"city": s("The city name"), "unit": s("Temperature unit", ["celsius", "fahrenheit"])}, ["city"],
             ["What's the weather in {city}?", "What is the weather like in {city}?", "Is it raining in {city}?",
              "How warm is it in {city} today?", "Tell me the weather in {city}.", "weather in {city}"],
             sp(lambda rng, sp_: {"city": city(rng, sp_)}), lambda rng, a: weather(rng),
             ["It is {forecast} in {city}, {temperature} degrees.", "The weather in {city} is {forecast}, "
              "{temperature} degrees."],
             pair_asks=["What's the weather in {a1[city]} and in {a2[city]}?",
                        "Weather in {a1[city]} and {a2[city]}, please."]),
        Tool("send_email", "Send an email to a person",
             {"to": s("The recipient's name"), "subject": s("The subject line"), "urgent": b("Mark it urgent")},
             ["to", "subject"],
             ["Send an email to {to} about {subject}.", "Email {to} with the subject {subject}.",
              "Please send {to} an email about {subject}."],
             sp(lambda rng, sp_: {"to": person(rng, sp_), "subject": word(rng, sp_)}),
             lambda rng, a: {"status": "sent"}, ["I have sent the email to {to}.", "The email to {to} was sent."]),
        Tool("multiply", "Multiply two numbers", {"x": n("The first factor"), "y": n("The second factor")},
             ["x", "y"], ["multiply {x} by {y}", "What is {x} times {y}?", "Please multiply {x} and {y}."],
             lambda rng: {"x": rng.choice([rng.randint(1, 99), round(rng.uniform(0.5, 20), 1)]),
                          "y": rng.randint(2, 30)},
             lambda rng, a: {"result": round(a["x"] * a["y"], 2)}, ["{x} times {y} is {result}."]),
        Tool("set_alarm", "Set an alarm", {"hour": i("Hour, 0 to 23"), "minute": i("Minute, 0 to 59")},
             ["hour", "minute"],
             ["Set an alarm for {hour}:{minute:02d}.", "Wake me at {hour}:{minute:02d}.",
              "Please set an alarm at {hour}:{minute:02d}."],
             lambda rng: {"hour": rng.randint(0, 23), "minute": rng.choice([0, 5, 10, 15, 20, 30, 40, 45, 50])},
             lambda rng, a: {"status": "set"}, ["Your alarm is set for {hour}:{minute:02d}."]),
        Tool("convert_currency", "Convert an amount between currencies",
             {"amount": n("The amount"), "source": s("From currency", ["USD", "EUR", "GBP", "JPY"]),
              "target": s("To currency", ["USD", "EUR", "GBP", "JPY"])}, ["amount", "source", "target"],
             ["Convert {amount} {source} to {target}.", "How much is {amount} {source} in {target}?"],
             lambda rng: dict(zip(["amount", "source", "target"],
                                  [rng.randint(1, 500)] + rng.sample(["USD", "EUR", "GBP", "JPY"], 2))),
             lambda rng, a: {"result": round(a["amount"] * rng.uniform(0.5, 1.5), 2)},
             ["{amount} {source} is {result} {target}."]),
        Tool("book_table", "Book a table at a restaurant",
             {"people": i("Number of guests"), "day": s("The day", DAYS), "details": {
                 "type": "object", "description": "Extra details",
                 "properties": {"outdoor": b("Sit outside"), "name": s("Name for the booking")}}},
             ["people", "day"],
             ["Book a table for {people} on {day}.", "Reserve a table for {people} people on {day}."],
             lambda rng: {"people": rng.randint(1, 12), "day": rng.choice(DAYS)},
             lambda rng, a: {"status": "booked"}, ["Your table for {people} on {day} is booked."]),
        Tool("set_light", "Turn a light on or off",
             {"room": s("The room"), "on": b("True to turn it on"), "colour": s("Light colour", COLOURS)},
             ["room", "on"],
             ["Turn on the light in the {room}.", "Switch the {room} light on.", "Lights on in the {room}, please."],
             lambda rng: {"room": rng.choice(["kitchen", "hall", "bedroom", "study", "garden", "parlour"]),
                          "on": True},
             lambda rng, a: {"status": "on"}, ["The light in the {room} is on."]),
    ]


def pick_tool(rng, split):
    """The tool a request asks for: held-out tools for the evaluation; in training mostly a generated one."""
    if split == HELD_OUT:
        return rng.choice(fixed_tools(HELD_OUT))
    return generated_tool(rng) if rng.random() < 0.75 else rng.choice(fixed_tools(TRAIN))


def distractors(rng, chosen, count):
    """`count` other training tools (never a held-out one), none named like a chosen one."""
    taken, out = {t.name for t in chosen}, []
    while len(out) < count:
        t = pick_tool(rng, TRAIN)
        if t.name not in taken:
            taken.add(t.name)
            out.append(t)
    return out
