"""What the task generators draw from (``analysis.tasks.build``): names, places and objects, the indirect-object
templates, facts, and greater-than's nouns and centuries; each filtered there to what a tokenizer reads as one
token."""

NAMES = ["Mary", "John", "Alice", "Bob", "Sarah", "Tom", "Anna", "James", "Emma", "David", "Laura", "Michael",
         "Kate", "Paul", "Lisa", "Mark", "Rachel", "Peter", "Linda", "Steve", "Jessica", "Daniel", "Amy", "Chris",
         "Helen", "Eric", "Grace", "Jack", "Emily", "Sam", "Julia", "Max", "Rose", "Adam", "Jane", "Ryan", "Lucy",
         "Kevin", "Nancy", "Brian", "Susan", "Frank", "Karen", "George", "Diana", "Henry", "Alex", "Victoria"]
PLACES = ["store", "garden", "restaurant", "school", "hospital", "office", "station", "house", "park", "beach",
          "market", "library", "church", "museum", "cafe", "airport", "hotel", "bank", "farm", "zoo"]
OBJECTS = ["drink", "ring", "kiss", "bone", "basketball", "computer", "necklace", "book", "letter", "snack",
           "apple", "key", "pen", "bag", "cake", "gift", "ticket", "phone", "card", "flower"]

# {A} and {B}: the first mentions; {S}: the subject again; {P} a place, {O} an object
IOI_TEMPLATES = [
    "When {A} and {B} went to the {P}, {S} gave a {O} to",
    "When {A} and {B} got a {O} at the {P}, {S} decided to give it to",
    "Then, {A} and {B} went to the {P}. {S} gave a {O} to",
    "After {A} and {B} went to the {P}, {S} gave a {O} to",
    "While {A} and {B} were working at the {P}, {S} gave a {O} to",
    "While {A} and {B} were commuting to the {P}, {S} gave a {O} to",
    "After the lunch, {A} and {B} went to the {P}. {S} gave a {O} to",
    "Afterwards, {A} and {B} went to the {P}. {S} gave a {O} to",
    "Then, {A} and {B} had a lot of fun at the {P}. {S} gave a {O} to",
    "Friends {A} and {B} found a {O} at the {P}. {S} gave it to",
    "When {A} and {B} arrived at the {P}, {S} handed a {O} to",
    "Yesterday {A} and {B} walked to the {P}, and {S} passed a {O} to",
    "At the {P}, {A} and {B} were talking. Later {S} sent a {O} to",
    "Today {A} and {B} met at the {P}. Then {S} brought a {O} to",
    "Once {A} and {B} were thinking about the {P}, {S} wanted to give a {O} to",
    "The day {A} and {B} went to the {P}, {S} threw a {O} to",
    "Later, {A} and {B} stopped by the {P}, where {S} offered a {O} to",
]

LANDMARKS = [("Eiffel Tower", "Paris"), ("Colosseum", "Rome"), ("Big Ben", "London"), ("Brandenburg Gate", "Berlin"),
             ("Kremlin", "Moscow"), ("Acropolis", "Athens"), ("Statue of Liberty", "New York"),
             ("Golden Gate Bridge", "San Francisco"), ("Sagrada Familia", "Barcelona"), ("Forbidden City", "Beijing"),
             ("Sydney Opera House", "Sydney"), ("Space Needle", "Seattle"), ("Leaning Tower", "Pisa"),
             ("Louvre", "Paris"), ("Prado Museum", "Madrid"), ("Rijksmuseum", "Amsterdam"), ("CN Tower", "Toronto"),
             ("Christ the Redeemer", "Rio"), ("Tower Bridge", "London"), ("Vatican", "Rome")]
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
            ("Russia", "Moscow"), ("Greece", "Athens"), ("Egypt", "Cairo"), ("England", "London"),
            ("Austria", "Vienna"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Poland", "Warsaw"),
            ("China", "Beijing"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Norway", "Oslo"),
            ("Sweden", "Stockholm"), ("Peru", "Lima"), ("Cuba", "Havana")]
LANGUAGES = [("France", "French"), ("Italy", "Italian"), ("Germany", "German"), ("Spain", "Spanish"),
             ("Japan", "Japanese"), ("Russia", "Russian"), ("Greece", "Greek"), ("Portugal", "Portuguese"),
             ("Poland", "Polish"), ("China", "Chinese"), ("Sweden", "Swedish"), ("Turkey", "Turkish"),
             ("Brazil", "Portuguese"), ("Mexico", "Spanish"), ("Egypt", "Arabic"), ("Korea", "Korean")]
FACT_TEMPLATES = {"city": (LANDMARKS, "The {X} is located in the city of"),
                  "capital": (CAPITALS, "The capital of {X} is the city of"),
                  "language": (LANGUAGES, "The official language of {X} is")}
WAR_NOUNS = ["war", "dynasty", "reign", "expedition", "siege", "treaty", "plague", "journey", "rebellion",
             "occupation", "empire", "conflict", "drought", "voyage", "campaign"]
CENTURIES = list(range(11, 18))

# An encoder's tasks, from the four foci of "Which do you like better, coffee or tea?" ({X}, {Y}: things to eat or
# drink; {R}: a relation; {S}: a sentiment word). Each template's corrupted form changes one focus, and the pair's
# probes are the texts whose embeddings the sentence's is compared with (answer, distractor).
FOODS = ["coffee", "tea", "juice", "milk", "water", "wine", "beer", "soda", "cake", "bread", "rice", "pasta", "soup",
         "pizza", "cheese", "fruit", "salad", "chicken", "fish", "chocolate", "pie", "candy", "eggs", "beans"]
OBJECT_TEMPLATES = ["Which do you like better, {X} or {Y}?", "Would you rather have {X} or {Y}?",
                    "Do you want {X} or {Y} today?", "We ordered {X} and {Y} for lunch."]
RELATIONS = [("like", "hate"), ("love", "hate"), ("enjoy", "hate"), ("want", "hate")]
RELATION_TEMPLATES = ["Which do you {R} more, {X} or {Y}?", "I {R} {X}.", "They really {R} {X} and {Y}.",
                      "Do you {R} {X}?"]
RELATION_PROBES = ("I {R} it.", "I {R} it.")
# (question, statement) with as many tokens
TYPE_TEMPLATES = [("Do you like {X}?", "You do like {X}."), ("Is {X} better than {Y}?", "{X} is better than {Y}."),
                  ("Can we drink {X}?", "We can drink {X}."),
                  ("Will they buy {X} or {Y}?", "They will buy {X} or {Y}."),
                  ("Did she order {X}?", "She did order {X}.")]
TYPE_PROBES = ("Is it?", "It is.")
# (sentiment words, as clean and corrupted, and the templates they fit)
SENTIMENTS = [([("better", "worse")], ["Which do you like {S}, {X} or {Y}?", "{X} is {S} than {Y}.",
                                      "This {X} tastes {S} than {Y}."]),
              ([("good", "bad"), ("great", "awful"), ("nice", "terrible")], ["The {X} was {S}.",
                                                                             "I think {X} is {S}."])]
