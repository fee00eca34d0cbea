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
)CORPUS";
  return kText;
}

}  // namespace bonsai
