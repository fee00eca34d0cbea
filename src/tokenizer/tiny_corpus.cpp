// The built-in training text of train_tiny_bpe (see bpe_trainer.h). Written for this project: plain
// English, code in a few languages, chat transcripts in the Qwen3.5 format, and short passages in other
// scripts, so a ~1-2k token vocabulary learns common English words and still covers everything else
// byte by byte. Changing this text changes every tiny pack's vocabulary: keep it stable.
#include "tokenizer/bpe_trainer.h"

namespace bonsai {

std::string_view tiny_bpe_corpus() {
  static constexpr std::string_view kText = R"CORPUS(The quick brown fox jumps over the lazy dog. The dog does not mind; it has seen the fox before.
A tokenizer turns text into numbers, and a model turns those numbers into more numbers. Then the tokenizer turns the numbers back into text.
When you read a sentence, you see words. When the model reads a sentence, it sees tokens: pieces of words, whole words, spaces, and punctuation.
Byte pair encoding starts from single bytes and learns which pairs appear together most often. The most frequent pair becomes a new token, and the process repeats.
It is simple, it is fast, and it never fails: any text at all can be written with the 256 byte tokens.
There was once a small village at the edge of a large forest. The people of the village worked in the fields during the day and told stories at night.
One of the stories was about a river that ran backwards. Nobody had ever seen it, but everybody knew somebody who had.
The children would ask where the river was, and the old men would point at the hills and say: "Beyond those, and then a little further."
In the morning the children went to school, where they learned to read and write, to add and subtract, and to draw maps of the world.
The teacher said that the world was round, that the sun was a star, and that the river in the story was probably just a story.
But the children did not believe her. They believed the old men, because the old men had been everywhere and the teacher had only been to the city.
Years later, one of those children became an engineer. She built bridges over real rivers, and every time she finished one she thought about the river that ran backwards.
What is the time? It's half past three. We're late again, and they'll be waiting for us. I'm sure you'd rather stay, but we've got to go.
Don't worry about it. You can't fix everything at once. She isn't here yet; he wasn't told. They won't mind if we're a few minutes late.
Please write a short poem about the sea. Here is one: The sea is grey, the sea is wide, it keeps its secrets deep inside.
Can you explain how attention works? Each token looks at the tokens before it and decides how much each of them matters for what comes next.
The model has many layers. Some layers use full attention, and others use a recurrent state that is updated once per token.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 32 42 64 100 128 256 512 1000 1024 2048 4096 8192 65536 1000000.
Prices: $3.50, $12.99, 7.5%, 3/4 cup, 1,234,567 people, version 2.0.1, 2024-06-01, 12:30, 98.6 degrees, -40, +1, 1e-6, 3.14159.
Phone: +1 (555) 010-2030. Room 404. Flight BA 2490 leaves at 07:45 from gate 12B. Order #A-1029 shipped on 3/14.
Lists are useful:
- first item
- second item
- third item with more words in it
1. one
2. two
3. three

Markdown has headings, **bold text**, *italic text*, `inline code`, and [links](https://example.com/docs/index.html).
> A quote is a line that starts with a greater-than sign.

| name  | value |
|-------|-------|
| alpha | 0.5   |
| beta  | 2     |

def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, value=1):
        self.counts[key] = self.counts.get(key, 0) + value
        return self.counts[key]

    def most_common(self, k=10):
        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:k]


if __name__ == "__main__":
    import sys
    counter = Counter()
    for line in sys.stdin:
        for word in line.split():
            counter.add(word.lower())
    for word, count in counter.most_common():
        print(f"{word}\t{count}")

#include <cstdint>
#include <string>
#include <vector>

// Sum of squares of a vector, accumulated in double.
double sum_squares(const std::vector<float>& x) {
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    s += static_cast<double>(x[i]) * x[i];
  }
  return s;
}

struct Token {
  int32_t id;
  std::string text;
};

int main(int argc, char** argv) {
  std::vector<Token> tokens;
  tokens.push_back({0, "hello"});
  tokens.push_back({1, " world"});
  for (const auto& t : tokens) {
    if (t.id < 0) return 1;
  }
  return 0;
}

fn main() {
    let words = vec!["apple", "banana", "cherry"];
    for (i, w) in words.iter().enumerate() {
        println!("{}: {}", i, w);
    }
}

function greet(name) {
  const message = `Hello, ${name}!`;
  console.log(message);
  return message.length;
}

SELECT name, COUNT(*) AS n FROM orders WHERE status = 'shipped' GROUP BY name ORDER BY n DESC;

{"model": "bonsai", "messages": [{"role": "user", "content": "Hello!"}], "temperature": 0.7, "max_tokens": 256, "stream": true}
{"id": 1, "name": "alpha", "tags": ["fast", "small"], "enabled": false, "score": null}

$ ls -la /usr/local/bin
$ git status && git log --oneline | head -5
$ cmake -S . -B build -G Ninja && cmake --build build -j8

<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
<think>
The user asks for the capital of France. That is Paris.
</think>

The capital of France is Paris.<|im_end|>
<|im_start|>user
And of Japan?<|im_end|>
<|im_start|>assistant
<think>

</think>

The capital of Japan is Tokyo.<|im_end|>
<|im_start|>user
What is the weather in Berlin?<|im_end|>
<|im_start|>assistant
<tool_call>
<function=get_weather>
<parameter=city>
Berlin
</parameter>
</function>
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temperature": 18, "conditions": "cloudy"}
</tool_response><|im_end|>
<|im_start|>assistant
It is 18 degrees and cloudy in Berlin right now.<|im_end|>
<|endoftext|>

Le renard brun rapide saute par-dessus le chien paresseux. Où est la gare ? C'est à côté de l'église, près du marché.
Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Mädchen, Brücke, schön, für, über.
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la biblioteca? ¡Qué día tan bonito! Niño, año, mañana.
A rápida raposa marrom pula sobre o cão preguiçoso. Não, coração, ação, você, está.
Il veloce volpe marrone salta sopra il cane pigro. Perché, città, più, così.
Szybki brązowy lis przeskakuje nad leniwym psem. Zażółć gęślą jaźń.
Hızlı kahverengi tilki tembel köpeğin üzerinden atlar. Çok güzel, teşekkür ederim.
Tiếng Việt: Con cáo nâu nhanh nhẹn nhảy qua con chó lười. Xin chào, cảm ơn bạn.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, как дела? Спасибо, хорошо.
Γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο. Καλημέρα, ευχαριστώ.
敏捷的棕色狐狸跳过了懒狗。你好，世界！今天天气很好，我们去公园散步吧。机器学习和自然语言处理。
素早い茶色の狐はのろまな犬を飛び越える。こんにちは、世界。今日はいい天気ですね。ありがとうございます。
빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요, 세계. 감사합니다.
الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم. شُكْرًا جَزِيلًا.
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया। धन्यवाद।
שועל חום מהיר קופץ מעל הכלב העצלן. שלום עולם.
สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ สวัสดีชาวโลก
Emoji: 😀 😂 👍 🎉 ❤️ 🚀 🌍 👩‍💻 👍🏽 🇫🇷 ✅ ⚠️
Math: ∑ ∫ √ π ≈ ≠ ≤ ≥ ∞ α β γ δ λ μ σ θ → ← ↔ × ÷ ±

The river in the story never appeared on any map, but the engineer kept looking. She traveled to the hills, and then a little further.
On the other side of the hills there was a valley, and in the valley there was a river. It ran from the sea toward the mountains.
Of course it did not really run backwards; the valley simply sloped the other way. But the children of the village had been right all along.
She wrote a letter to her old teacher. "The river is real," she wrote. "It is just not where anyone expected it to be."
The teacher wrote back a week later. "Most true things are like that," she said. "Thank you for looking."

Questions and answers:
Q: How many bytes are there in a kilobyte? A: Either 1000 or 1024, depending on who you ask.
Q: Why is the sky blue? A: Because air scatters short wavelengths of sunlight more than long ones.
Q: What is a prime number? A: A whole number greater than 1 whose only divisors are 1 and itself: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29.
Q: Who wrote this text? A: Nobody famous. It exists only to teach a very small tokenizer some very common words.

Instructions: Read the input file line by line. For each line, remove leading and trailing whitespace, skip empty lines, and count the words.
Then print the total number of lines, words, and characters. If the file does not exist, print an error message and exit with status 1.
Error: file not found: /tmp/input.txt
Warning: the value of `max_tokens` is larger than the context length; it will be reduced to 4096.
Info: loaded 12 layers in 0.84 s (1.2 GB/s).

Chapter two. The engineer's notebook.
Monday: measured the water level at the old mill. It was higher than last year, which is strange, because there was less rain.
Tuesday: talked to the farmer who owns the land near the bend. He says the river changes its mind every spring.
Wednesday: the instruments arrived. Two of them were broken, so I spent the afternoon repairing them with tape and patience.
Thursday: first real data. The flow near the surface goes one way, and the flow near the bottom goes the other way. Nobody will believe this.
Friday: everybody believed it. Apparently this is well known to anyone who has studied estuaries. I should have read more books.
Saturday: read more books. Learned about tides, salt wedges, density, and the difference between fresh water and sea water.
Sunday: rested. Walked along the river for three hours and did not measure anything at all. It was the best day of the week.

Good software is written twice: once to understand the problem and once to solve it. The first version teaches you what the second version should be.
Write tests before you trust your code. Measure before you optimize. Read the error message before you search for the answer.
A function should do one thing, and its name should say what that thing is. If you cannot name it, you do not yet understand it.
Keep the data close to the code that uses it. Copying memory is cheap until it is not, and then it is the only thing that matters.
Performance is a feature. Correctness is a requirement. Simplicity is what makes both of them possible over a long period of time.
When a program is slow, the reason is usually one of three things: it does too much work, it waits for something, or it moves too much data.
The computer does exactly what you tell it to do. The hard part is knowing what you told it.

import json
import os
from pathlib import Path


def load_config(path: str) -> dict:
    """Load a JSON configuration file and fill in default values."""
    with open(path, "r", encoding="utf-8") as f:
        config = json.load(f)
    config.setdefault("batch_size", 32)
    config.setdefault("learning_rate", 0.001)
    config.setdefault("num_layers", 4)
    return config


def save_results(results: list, output_dir: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    for i, result in enumerate(results):
        path = Path(output_dir) / f"result_{i:04d}.json"
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, ensure_ascii=False)


class Model:
    def __init__(self, config):
        self.config = config
        self.layers = [Layer(i, config) for i in range(config["num_layers"])]

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __repr__(self):
        return f"Model(num_layers={len(self.layers)})"

template <typename T>
class Matrix {
 public:
  Matrix(size_t rows, size_t cols) : rows_(rows), cols_(cols), data_(rows * cols) {}
  T& operator()(size_t r, size_t c) { return data_[r * cols_ + c]; }
  const T& operator()(size_t r, size_t c) const { return data_[r * cols_ + c]; }
  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }

 private:
  size_t rows_;
  size_t cols_;
  std::vector<T> data_;
};

// y = W x for a row-major matrix W of shape [rows, cols].
void matvec(const Matrix<float>& w, const float* x, float* y) {
  for (size_t r = 0; r < w.rows(); ++r) {
    float acc = 0.0f;
    for (size_t c = 0; c < w.cols(); ++c) {
      acc += w(r, c) * x[c];
    }
    y[r] = acc;
  }
}

static void check(bool condition, const std::string& message) {
  if (!condition) {
    throw std::runtime_error("check failed: " + message);
  }
}

package main

import (
	"fmt"
	"strings"
)

func main() {
	words := strings.Fields("the quick brown fox")
	for i, w := range words {
		fmt.Printf("%d %s\n", i, strings.ToUpper(w))
	}
}

<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Example page</title>
</head>
<body>
  <h1>Hello, world</h1>
  <p class="note">This is a paragraph with a <a href="/about">link</a>.</p>
</body>
</html>

<|im_start|>system
You are a careful assistant. Answer briefly and accurately.<|im_end|>
<|im_start|>user
Write a function that reverses a string in Python.<|im_end|>
<|im_start|>assistant
<think>
The user wants a simple function. Slicing with a negative step reverses a string.
</think>

Here is a short function:

```python
def reverse(s: str) -> str:
    return s[::-1]
```

It returns a new string with the characters in reverse order.<|im_end|>
<|im_start|>user
How do I read a file line by line in C++?<|im_end|>
<|im_start|>assistant
<think>
Use std::ifstream and std::getline in a loop.
</think>

Open the file with `std::ifstream` and call `std::getline` until it returns false:

```cpp
std::ifstream in("input.txt");
std::string line;
while (std::getline(in, line)) {
  std::cout << line << '\n';
}
```<|im_end|>
<|im_start|>user
Summarize the story of the river in one sentence.<|im_end|>
<|im_start|>assistant
<think>
The story is about a river that seems to run backwards; an engineer finds it and learns that true things are often not where we expect them.
</think>

A girl who grew up hearing about a river that ran backwards became an engineer, found the river beyond the hills, and learned that the truth was real but unexpected.<|im_end|>
<|im_start|>user
What time is it in Tokyo?<|im_end|>
<|im_start|>assistant
<tool_call>
<function=get_time>
<parameter=timezone>
Asia/Tokyo
</parameter>
</function>
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"time": "21:15", "date": "2025-03-02"}
</tool_response><|im_end|>
<|im_start|>assistant
It is 21:15 in Tokyo on March 2, 2025.<|im_end|>
<|endoftext|>

The weather today is sunny with a light breeze from the west. Temperatures will reach 24 degrees in the afternoon and fall to 15 degrees at night.
Tomorrow there is a chance of rain in the morning, clearing by noon. The weekend looks dry and warm, with more sunshine on Sunday than on Saturday.
In the news: the city council approved a new park near the river, the library will stay open later on weekdays, and the train station is being repaired.
Sports: the home team won their third game in a row, scoring two goals in the second half after a quiet first half.
Recipe: mix two cups of flour, one cup of milk, two eggs, a pinch of salt, and a spoon of sugar. Let the batter rest for ten minutes, then cook it in a hot pan.
Travel tips: carry a small bottle of water, check the opening hours before you go, and always keep a copy of your passport in a separate bag.
Health: sleep at least seven hours, walk every day, drink water, eat vegetables, and do not spend the whole day looking at a screen.

Dear team,
Thank you for your work on the new release. The tests are passing, the documentation is up to date, and the performance numbers look good.
Please review the open issues before Friday, and let me know if anything is blocking you. We will discuss the plan for the next release on Monday.
Best regards,
Alice

Hi Bob,
Could you send me the latest version of the report? I would like to check the numbers in the third table before the meeting.
Thanks,
Carol

Le matin, nous prenons le café sur la terrasse. L'après-midi, nous travaillons dans le jardin, et le soir nous lisons des livres.
Am Morgen trinken wir Kaffee auf der Terrasse. Am Nachmittag arbeiten wir im Garten, und am Abend lesen wir Bücher.
Por la mañana tomamos café en la terraza. Por la tarde trabajamos en el jardín, y por la noche leemos libros.
Утром мы пьём кофе на террасе. Днём мы работаем в саду, а вечером читаем книги.
早上我们在阳台上喝咖啡。下午我们在花园里工作，晚上我们看书。
朝はテラスでコーヒーを飲みます。午後は庭で働き、夜は本を読みます。
아침에는 테라스에서 커피를 마십니다. 오후에는 정원에서 일하고 저녁에는 책을 읽습니다.
في الصباح نشرب القهوة على الشرفة. في المساء نقرأ الكتب.
सुबह हम छत पर कॉफ़ी पीते हैं। शाम को हम किताबें पढ़ते हैं।

Frequently used words: the, be, to, of, and, a, in, that, have, it, for, not, on, with, he, as, you, do, at, this, but, his, by, from, they, we, say, her, she, or, an, will, my, one, all, would, there, their, what, so, up, out, if, about, who, get, which, go, me, when, make, can, like, time, no, just, him, know, take, people, into, year, your, good, some, could, them, see, other, than, then, now, look, only, come, its, over, think, also, back, after, use, two, how, our, work, first, well, way, even, new, want, because, any, these, give, day, most, us.
Common code words: return, if, else, for, while, break, continue, function, class, struct, public, private, const, static, void, int, float, double, bool, true, false, null, None, self, this, import, include, namespace, template, typename, auto, std, vector, string, size_t, printf, print, range, len, list, dict, map, set, key, value, index, count, result, error, data, buffer, input, output, config, model, layer, token, tokens, text, path, file, line, lines, name, type, test, tests.
)CORPUS";
  return kText;
}

}  // namespace bonsai
