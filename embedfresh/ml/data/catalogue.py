"""The product catalogue the data generator draws from: categories, their wordings and
attribute values, brands, and the words shoppers use. Plain data, no code.

:mod:`embedfresh.ml.data.generate` turns these tables into products, queries and labels.
Any change here changes every generated data set (the generator's output is a pure
function of these tables and the seed), so a change is a new data set, not a fix.
"""

from __future__ import annotations

import dataclasses

ATTRIBUTE_KINDS: tuple[str, ...] = ("color", "material", "size", "use", "style")
#: Positions in :data:`ATTRIBUTE_KINDS`: the ``kind`` that :meth:`Category.values` takes.
COLOR, MATERIAL, SIZE, USE, STYLE = range(len(ATTRIBUTE_KINDS))


@dataclasses.dataclass(frozen=True)
class Category:
    """One product category: its wording, attribute values and price level.

    ``nouns`` are the wordings titles use; ``query_nouns`` are synonyms only shoppers
    type, so matching them to a category has to be learned from the labels. ``sizes``
    are listed smallest first (larger sizes cost more) and may be empty.
    """

    key: str
    domain: str
    nouns: tuple[str, ...]
    query_nouns: tuple[str, ...]
    colors: tuple[str, ...]
    materials: tuple[str, ...]
    sizes: tuple[str, ...]
    uses: tuple[str, ...]
    styles: tuple[str, ...]
    features: tuple[str, ...]
    price_median: float
    price_sigma: float = 0.45
    audience: bool = False

    def values(self, kind: int) -> tuple[str, ...]:
        """The values of attribute ``kind`` (:data:`COLOR` ... :data:`STYLE`)."""
        return (self.colors, self.materials, self.sizes, self.uses, self.styles)[kind]


_APPAREL_COLORS = ("Black", "White", "Gray", "Navy", "Blue", "Red", "Green", "Pink")
_TECH_COLORS = ("Black", "Silver", "Gray", "White", "Blue", "Rose Gold")
_HOME_COLORS = ("Black", "White", "Gray", "Silver", "Red", "Beige")

CATEGORIES: tuple[Category, ...] = (
    Category(
        "running_shoes",
        "footwear",
        ("Running Shoes", "Sneakers", "Trainers", "Jogging Shoes"),
        ("runners", "kicks"),
        _APPAREL_COLORS,
        ("Mesh", "Knit", "Leather", "Synthetic"),
        (),
        ("road running", "marathon training", "gym workouts", "walking", "trail running"),
        ("Lightweight", "Cushioned", "Breathable", "Stability", "Minimalist"),
        ("a responsive foam midsole", "a grippy rubber outsole", "reflective details"),
        95.0,
        audience=True,
    ),
    Category(
        "hiking_boots",
        "footwear",
        ("Hiking Boots", "Trekking Boots", "Trail Boots"),
        ("mountain boots", "hikers"),
        ("Brown", "Black", "Gray", "Olive", "Beige"),
        ("Leather", "Suede", "Nubuck", "Synthetic"),
        (),
        ("day hikes", "backpacking", "winter hiking", "mountaineering"),
        ("Waterproof", "Insulated", "Rugged", "Lightweight"),
        ("a waterproof membrane", "a lugged Vibram-style outsole", "ankle support"),
        140.0,
        audience=True,
    ),
    Category(
        "rain_jackets",
        "outdoor",
        ("Rain Jacket", "Waterproof Jacket", "Shell Jacket"),
        ("raincoat", "anorak"),
        _APPAREL_COLORS + ("Yellow", "Olive"),
        ("Nylon", "Polyester", "Recycled Nylon"),
        (),
        ("hiking", "commuting", "cycling", "travel"),
        ("Packable", "Hooded", "Breathable", "Lightweight"),
        ("sealed seams", "zippered pockets", "an adjustable hood"),
        110.0,
        audience=True,
    ),
    Category(
        "backpacks",
        "outdoor",
        ("Backpack", "Rucksack", "Daypack"),
        ("knapsack", "bookbag"),
        ("Black", "Gray", "Navy", "Green", "Red", "Olive"),
        ("Nylon", "Canvas", "Polyester", "Leather"),
        ("20L", "25L", "30L", "40L"),
        ("school", "travel", "hiking", "work", "commuting"),
        ("Water-Resistant", "Anti-Theft", "Rolltop", "Lightweight"),
        ("a padded laptop sleeve", "a USB charging port", "padded shoulder straps"),
        60.0,
    ),
    Category(
        "luggage",
        "outdoor",
        ("Suitcase", "Carry-On Luggage", "Rolling Luggage"),
        ("trolley case", "roller bag"),
        ("Black", "Silver", "Navy", "Red", "Green", "Rose Gold"),
        ("Polycarbonate", "Aluminum", "Nylon", "ABS"),
        ("20-Inch", "24-Inch", "28-Inch"),
        ("business travel", "weekend trips", "international travel"),
        ("Hardside", "Expandable", "Spinner", "Lightweight"),
        ("a TSA-approved lock", "360-degree spinner wheels", "a telescoping handle"),
        150.0,
    ),
    Category(
        "laptops",
        "electronics",
        ("Laptop", "Notebook Computer", "Ultrabook"),
        ("notebook pc", "portable computer"),
        _TECH_COLORS,
        ("Aluminum", "Magnesium Alloy", "Plastic"),
        ("13-Inch", "14-Inch", "15-Inch", "16-Inch", "17-Inch"),
        ("gaming", "business", "students", "video editing", "programming"),
        ("Slim", "2-in-1", "Thin and Light", "Rugged"),
        ("a backlit keyboard", "all-day battery life", "a fast SSD", "a full HD display"),
        850.0,
        0.5,
    ),
    Category(
        "tablets",
        "electronics",
        ("Tablet", "Tablet PC"),
        ("touchscreen tablet", "slate computer"),
        _TECH_COLORS,
        ("Aluminum", "Plastic"),
        ("8-Inch", "10-Inch", "11-Inch", "12-Inch"),
        ("reading", "drawing", "kids", "streaming"),
        ("Slim", "Compact", "Kids-Friendly", "Pro"),
        ("a stylus", "a high-resolution display", "quad speakers"),
        330.0,
        0.5,
    ),
    Category(
        "smartphones",
        "electronics",
        ("Smartphone", "Cell Phone", "Mobile Phone"),
        ("cellphone", "android phone"),
        _TECH_COLORS + ("Green",),
        ("Glass", "Aluminum", "Plastic"),
        ("64GB", "128GB", "256GB", "512GB"),
        ("photography", "gaming", "seniors", "business"),
        ("Unlocked", "Dual-SIM", "Compact", "Rugged"),
        ("a triple camera", "fast charging", "a 120Hz display", "5G connectivity"),
        480.0,
        0.55,
    ),
    Category(
        "smartwatches",
        "electronics",
        ("Smartwatch", "Smart Watch", "Fitness Tracker Watch"),
        ("fitness watch", "wearable"),
        ("Black", "Silver", "Rose Gold", "Pink", "Green", "Blue"),
        ("Aluminum", "Stainless Steel", "Titanium", "Silicone"),
        ("40mm", "42mm", "44mm", "46mm"),
        ("running", "swimming", "sleep tracking", "cycling"),
        ("Sporty", "Classic", "Rugged", "Slim"),
        ("GPS", "a heart-rate sensor", "a week-long battery"),
        220.0,
    ),
    Category(
        "headphones",
        "audio",
        ("Headphones", "Over-Ear Headphones", "Headset"),
        ("cans", "studio monitors"),
        ("Black", "White", "Silver", "Navy", "Beige"),
        ("Plastic", "Aluminum", "Leather"),
        (),
        ("gaming", "studio monitoring", "travel", "working from home"),
        ("Noise-Cancelling", "Wireless", "Foldable", "Closed-Back"),
        ("memory foam ear cushions", "a detachable microphone", "40-hour battery life"),
        120.0,
        0.55,
    ),
    Category(
        "earbuds",
        "audio",
        ("Wireless Earbuds", "In-Ear Earbuds", "True Wireless Earphones"),
        ("earpods", "in-ear monitors"),
        ("Black", "White", "Blue", "Pink", "Green"),
        ("Plastic", "Silicone"),
        (),
        ("running", "workouts", "calls", "commuting"),
        ("Noise-Cancelling", "Sweatproof", "Compact", "Sport"),
        ("a charging case", "touch controls", "an IPX5 rating"),
        70.0,
        0.55,
    ),
    Category(
        "speakers",
        "audio",
        ("Bluetooth Speaker", "Portable Speaker", "Wireless Speaker"),
        ("boombox", "sound box"),
        ("Black", "Blue", "Red", "Gray", "Green", "Orange"),
        ("Fabric", "Rubberized Plastic", "Aluminum"),
        ("10W", "20W", "40W", "60W"),
        ("outdoor parties", "the beach", "the shower", "camping"),
        ("Waterproof", "Rugged", "Compact", "Party"),
        ("deep bass", "a built-in microphone", "24-hour playtime"),
        60.0,
        0.55,
    ),
    Category(
        "coffee_makers",
        "kitchen",
        ("Coffee Maker", "Drip Coffee Machine", "Coffee Brewer"),
        ("coffeemaker", "java machine"),
        _HOME_COLORS,
        ("Stainless Steel", "Plastic", "Glass"),
        ("4-Cup", "8-Cup", "10-Cup", "12-Cup", "14-Cup"),
        ("home", "the office", "single servings"),
        ("Programmable", "Compact", "Thermal", "Single-Serve"),
        ("a reusable filter", "an auto shut-off", "a keep-warm plate"),
        75.0,
    ),
    Category(
        "kettles",
        "kitchen",
        ("Electric Kettle", "Water Kettle", "Tea Kettle"),
        ("water boiler", "hot pot"),
        _HOME_COLORS,
        ("Stainless Steel", "Glass", "Plastic"),
        ("1-Liter", "1.5-Liter", "1.7-Liter"),
        ("tea", "pour-over coffee", "the office"),
        ("Cordless", "Gooseneck", "Variable-Temperature", "Rapid-Boil"),
        ("boil-dry protection", "a keep-warm function", "a 360-degree base"),
        40.0,
    ),
    Category(
        "blenders",
        "kitchen",
        ("Blender", "Countertop Blender", "Smoothie Maker"),
        ("smoothie machine", "liquidizer"),
        _HOME_COLORS,
        ("Glass", "BPA-Free Plastic", "Stainless Steel"),
        ("32-Ounce", "48-Ounce", "64-Ounce", "72-Ounce"),
        ("smoothies", "crushing ice", "soups", "protein shakes"),
        ("High-Speed", "Personal", "Professional", "Compact"),
        ("a pulse function", "dishwasher-safe parts", "preset programs"),
        90.0,
        0.55,
    ),
    Category(
        "cookware",
        "kitchen",
        ("Frying Pan", "Skillet", "Saute Pan"),
        ("fry pan", "pan"),
        ("Black", "Gray", "Silver", "Red", "Blue"),
        ("Cast Iron", "Stainless Steel", "Nonstick Aluminum", "Carbon Steel", "Copper"),
        ("8-Inch", "10-Inch", "12-Inch"),
        ("induction cooktops", "searing steaks", "eggs", "camping"),
        ("Nonstick", "Pre-Seasoned", "Tri-Ply", "Oven-Safe"),
        ("a stay-cool handle", "a tempered glass lid", "an induction-ready base"),
        45.0,
    ),
    Category(
        "knives",
        "kitchen",
        ("Chef Knife", "Kitchen Knife", "Cook's Knife"),
        ("chef's knife", "santoku"),
        ("Black", "Silver", "Brown", "Blue"),
        ("Stainless Steel", "High-Carbon Steel", "Damascus Steel", "Ceramic"),
        ("6-Inch", "8-Inch", "10-Inch"),
        ("professional chefs", "home cooks", "slicing meat", "chopping vegetables"),
        ("Japanese-Style", "German-Style", "Forged", "Ultra-Sharp"),
        ("an ergonomic handle", "a blade guard", "a full tang"),
        55.0,
        0.6,
    ),
    Category(
        "office_chairs",
        "office",
        ("Office Chair", "Desk Chair", "Ergonomic Chair"),
        ("computer chair", "task chair"),
        ("Black", "Gray", "White", "Blue", "Beige"),
        ("Mesh", "Leather", "Fabric", "Faux Leather"),
        (),
        ("long hours", "gaming", "home offices", "back pain"),
        ("Ergonomic", "High-Back", "Big and Tall", "Reclining"),
        ("adjustable lumbar support", "4D armrests", "a tilt lock"),
        180.0,
        0.55,
    ),
    Category(
        "desks",
        "office",
        ("Standing Desk", "Computer Desk", "Writing Desk"),
        ("workstation", "sit-stand table"),
        ("Black", "White", "Brown", "Gray", "Beige"),
        ("Solid Wood", "Oak", "Walnut", "Steel", "Bamboo"),
        ("40-Inch", "48-Inch", "55-Inch", "63-Inch"),
        ("home offices", "gaming", "small spaces"),
        ("Height-Adjustable", "L-Shaped", "Minimalist", "Electric"),
        ("a cable tray", "memory presets", "a scratch-resistant top"),
        250.0,
        0.5,
    ),
    Category(
        "desk_lamps",
        "office",
        ("Desk Lamp", "Table Lamp", "Reading Lamp"),
        ("study light", "task light"),
        ("Black", "White", "Silver", "Gray", "Brown"),
        ("Metal", "Aluminum", "Wood", "Plastic"),
        (),
        ("reading", "studying", "home offices", "crafts"),
        ("LED", "Dimmable", "Architect", "Clamp-On"),
        ("a USB charging port", "five color temperatures", "a flexible gooseneck"),
        35.0,
    ),
    Category(
        "yoga_mats",
        "fitness",
        ("Yoga Mat", "Exercise Mat", "Fitness Mat"),
        ("pilates mat", "workout mat"),
        ("Purple", "Blue", "Pink", "Black", "Green", "Gray"),
        ("Cork", "Natural Rubber", "TPE", "PVC"),
        ("4mm", "6mm", "8mm"),
        ("hot yoga", "pilates", "travel", "home workouts"),
        ("Non-Slip", "Extra-Thick", "Foldable", "Eco-Friendly"),
        ("alignment lines", "a carrying strap", "a moisture-wicking surface"),
        35.0,
    ),
    Category(
        "water_bottles",
        "fitness",
        ("Water Bottle", "Sports Bottle", "Drinking Bottle"),
        ("flask", "canteen"),
        ("Black", "White", "Blue", "Pink", "Green", "Purple"),
        ("Stainless Steel", "Glass", "BPA-Free Plastic", "Aluminum"),
        ("12-Ounce", "20-Ounce", "32-Ounce", "40-Ounce"),
        ("hiking", "the gym", "kids", "cycling"),
        ("Insulated", "Leak-Proof", "Collapsible", "Wide-Mouth"),
        ("a straw lid", "a carry loop", "double-wall vacuum insulation"),
        25.0,
    ),
)

# Pairs whose products share vocabulary or use: the hard negatives of each other.
RELATED_PAIRS: tuple[tuple[str, str], ...] = (
    ("running_shoes", "hiking_boots"),
    ("hiking_boots", "rain_jackets"),
    ("backpacks", "luggage"),
    ("laptops", "tablets"),
    ("tablets", "smartphones"),
    ("smartphones", "smartwatches"),
    ("headphones", "earbuds"),
    ("earbuds", "speakers"),
    ("coffee_makers", "kettles"),
    ("blenders", "coffee_makers"),
    ("cookware", "knives"),
    ("office_chairs", "desks"),
    ("desks", "desk_lamps"),
    ("yoga_mats", "water_bottles"),
    ("water_bottles", "backpacks"),
    ("running_shoes", "smartwatches"),
)

# (name, domain, price tier): 0 budget, 1 mainstream, 2 premium.
BRANDS: tuple[tuple[str, str, int], ...] = (
    ("Trailblaze", "footwear", 1),
    ("Stridewell", "footwear", 1),
    ("Fleetfoot", "footwear", 0),
    ("Pacemark", "footwear", 0),
    ("Kestrel", "footwear", 2),
    ("Altura", "footwear", 2),
    ("Northridge", "outdoor", 1),
    ("Wanderfold", "outdoor", 1),
    ("Packwise", "outdoor", 0),
    ("Basecamp Co.", "outdoor", 0),
    ("Summitline", "outdoor", 2),
    ("Ironpine", "outdoor", 2),
    ("Voltix", "electronics", 1),
    ("Orbix", "electronics", 1),
    ("Novatek", "electronics", 0),
    ("Pixelon", "electronics", 0),
    ("Lumentra", "electronics", 2),
    ("Zephyr Labs", "electronics", 2),
    ("Bassline", "audio", 1),
    ("Echora", "audio", 1),
    ("Tunebox", "audio", 0),
    ("Wavecrest", "audio", 0),
    ("Sonique", "audio", 2),
    ("Aurial", "audio", 2),
    ("Brewmaster", "kitchen", 1),
    ("Hearthstone", "kitchen", 1),
    ("Kitchenly", "kitchen", 0),
    ("Zestio", "kitchen", 0),
    ("Copperleaf", "kitchen", 2),
    ("Forgecraft", "kitchen", 2),
    ("Workwell", "office", 1),
    ("Oakline", "office", 1),
    ("Officio", "office", 0),
    ("Simplio", "office", 0),
    ("Ergoform", "office", 2),
    ("Posturelab", "office", 2),
    ("Zenflow", "fitness", 1),
    ("Flexcore", "fitness", 0),
    ("Aquavita", "fitness", 0),
    ("Hydrapeak", "fitness", 2),
    ("Balancia", "fitness", 2),
    ("Corestride", "fitness", 1),
)

# Title prefixes of categories with ``audience=True`` (trailing space included).
AUDIENCES = ("Men's ", "Women's ", "Unisex ")
WARRANTY_YEARS = ("1", "2", "3", "5")
# How shoppers word a budget or a premium intent.
BUDGET_WORDS = ("cheap", "budget", "affordable", "inexpensive")
PREMIUM_WORDS = ("best", "premium", "top rated", "high end", "best rated")

# The limits of explicit budget queries ("under $50"), ascending.
NICE_PRICES: tuple[int, ...] = (
    10,
    15,
    20,
    25,
    30,
    40,
    50,
    60,
    75,
    80,
    100,
    120,
    150,
    200,
    250,
    300,
    400,
    500,
    600,
    700,
    800,
    1000,
    1200,
    1500,
    2000,
)
