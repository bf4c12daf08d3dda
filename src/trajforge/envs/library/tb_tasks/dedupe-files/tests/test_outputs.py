import os

root = "/app/photos"
left = {}
for top, _, files in os.walk(root):
    for f in files:
        path = os.path.join(top, f)
        left[os.path.relpath(path, root)] = open(path).read()
assert left == {
    "B.jpg": "picture X\n",
    "c.jpg": "picture Y\n",
    "f.jpg": "picture Z\n",
    "g.jpg": "picture W\n",
}, left
removed = open("/app/removed.txt").read().splitlines()
assert removed == ["a.jpg", "b/a-copy.jpg", "d/e/c2.jpg", "h/zz.jpg"], removed
