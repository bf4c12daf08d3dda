got = open("/app/emails.txt").read().splitlines()
assert got == [
    "ann.lee@example.com",
    "bo+news@mail.example.org",
    "bo@example.net",
    "eve_99@sub.domain.co.uk",
    "sales-team@corp-mail.io",
], got
