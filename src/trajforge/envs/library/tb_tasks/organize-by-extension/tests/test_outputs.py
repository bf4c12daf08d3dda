import os

expected = {
    "txt/notes.txt": "meeting at 10\n",
    "txt/todo.TXT": "buy milk\n",
    "jpg/photo.jpg": "jpeg-bytes-1\n",
    "jpg/scan.JPG": "jpeg-bytes-2\n",
    "gz/backup.tar.gz": "gzip-bytes\n",
    "none/Makefile": "all:\n\ttrue\n",
    "csv/data.csv": "a,b\n1,2\n",
    "none/README": "read me\n",
}
found = {}
for top, _, files in os.walk("/app/sorted"):
    for f in files:
        path = os.path.join(top, f)
        found[os.path.relpath(path, "/app/sorted")] = open(path).read()
assert found == expected, found
assert os.path.isdir("/app/inbox") and os.listdir("/app/inbox") == [], os.listdir("/app/inbox")
