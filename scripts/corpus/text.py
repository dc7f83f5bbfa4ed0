"""Filler text and hard negatives for the corpus.

Filler: English and Russian prose assembled from word lists, long identifiers, log noise.
Hard negatives: strings that look like secrets to a naive scanner and are not — UUIDs, git
SHAs, SHA-256/512 digests, base64 images, public keys and certificates, publishable keys,
documentation example keys, placeholders and templates, environment lookups.
"""
import base64

from formats import ALNUM, B64, HEX, LOWER_ALNUM, jwt

EN_WORDS = """the a service request response cache model token budget deploy cluster node latency
throughput replica tenant gateway stream chunk buffer config value default retry timeout queue
worker batch schedule index search vector prompt answer question user account billing invoice
report export import migration schema table column field record event metric alert dashboard
pipeline build test release version branch commit merge review incident policy access role
permission audit log trace span error warning info debug handler router middleware client server
endpoint header payload document file folder path image upload download storage bucket region
zone network proxy certificate domain session cookie password key secret credential rotation""".split()
EN_VERBS = "returns stores loads sends reads writes checks rotates caches streams validates parses renders updates creates deletes".split()
RU_WORDS = """сервис запрос ответ кэш модель токен бюджет развёртывание кластер узел задержка
пропускная способность реплика арендатор шлюз поток фрагмент буфер конфигурация значение
очередь обработчик пакет расписание индекс поиск вектор подсказка вопрос пользователь аккаунт
счёт отчёт экспорт импорт миграция схема таблица столбец поле запись событие метрика
оповещение панель конвейер сборка тест релиз версия ветка коммит слияние проверка инцидент
политика доступ роль разрешение аудит журнал трассировка ошибка предупреждение маршрутизатор
клиент сервер заголовок документ файл каталог путь изображение загрузка хранилище регион сеть
прокси сертификат домен сессия пароль ключ секрет ротация""".split()
RU_VERBS = "возвращает хранит загружает отправляет читает пишет проверяет кэширует обновляет создаёт удаляет".split()
EN_OPEN = ["Sure! Here's how to set this up.", "Great question.", "Here is a working example.", "Below is the configuration you asked for.",
           "You can do this in a few steps.", "The error usually means the client is misconfigured.", "Let me walk you through it."]
RU_OPEN = ["Конечно! Вот как это настроить.", "Хороший вопрос.", "Вот рабочий пример.", "Ниже конфигурация, которую вы просили.",
           "Это можно сделать в несколько шагов.", "Обычно такая ошибка означает, что клиент настроен неверно.", "Давайте разберём по шагам."]


def sentence(g, ru=False):
    words, verbs = (RU_WORDS, RU_VERBS) if ru else (EN_WORDS, EN_VERBS)
    n = g.r.randint(6, 16)
    ws = [g.r.choice(words) for _ in range(n)]
    ws.insert(g.r.randint(1, n - 1), g.r.choice(verbs))
    s = " ".join(ws)
    return s[0].upper() + s[1:] + g.r.choice([".", ".", ".", "?", "!", ":"]) if s else ""


def paragraph(g, ru=False, n=None):
    return " ".join(sentence(g, ru) for _ in range(n or g.r.randint(2, 6)))


def identifier(g):
    parts = [g.r.choice(EN_WORDS).capitalize() for _ in range(g.r.randint(3, 7))]
    style = g.r.choice(["camel", "snake", "const", "pascal"])
    if style == "snake":
        return "_".join(p.lower() for p in parts)
    if style == "const":
        return "_".join(p.upper() for p in parts)
    if style == "camel":
        return parts[0].lower() + "".join(parts[1:])
    return "".join(parts)


def png_data_uri(g):
    raw = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + g.bytes_(g.r.randint(120, 700))
    return "data:image/png;base64," + base64.b64encode(raw).decode()


JWT_IO = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
          "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")

# Credential-shaped code that holds no credential: lookups, types, templates, comparisons.
CODE_NEGATIVES = [
    'password = input("Password: ")', "if password == confirm_password:", "user.set_password(raw_password)",
    '  apiKey: apiKey,', "  apiKey: string;", "  secret: process.env.SESSION_SECRET!,", "password = var.db_password",
    'secret_key = data.vault_generic_secret.app.data["secret_key"]', "      api-key: ${{ secrets.API_KEY }}",
    "  password: {{ .Values.password | b64enc | quote }}", 'String password = System.getenv("DB_PASSWORD");',
    '@Value("${app.jwt.secret}") private String secret;', '\tPassword: os.Getenv("DB_PASSWORD"),',
    'options.ClientSecret = Configuration["AzureAd:ClientSecret"];', "пароль: ********",
    'token = jwt.encode(payload, SECRET_KEY, algorithm="HS256")', "Authorization: Bearer ${process.env.TOKEN}",
    'headers["Authorization"] = f"Bearer {self.access_token}"', "//npm.internal/:_authToken=${NPM_TOKEN}",
    "      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:-postgres}", "git clone git@git.internal:org/repo.git",
    "See https://medium.com/@someone/rotating-keys-4f2a9c for details.", "Contact: ivan.petrov@company.example",
    '"password": "${{ secrets.DB_PASS }}"', "secret_key_base = Rails.application.credentials.secret_key_base",
    "api_key = settings.OPENAI_API_KEY", "const token = await getAccessToken(clientId, scopes);",
    "client_secret = keyring.get_password('svc', 'client_secret')", "export GITHUB_TOKEN=$(gh auth token)",
    "AWS_SECRET_ACCESS_KEY=$(aws configure get aws_secret_access_key)", "password: !!binary |",
    "hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt())", "access_token_lifetime = timedelta(minutes=15)",
    "refresh_token_rotation: true", "SECRET_KEY_LENGTH = 64", 'private_key = serialization.load_pem_private_key(data, password=None)',
]

PLACEHOLDERS = [
    "OPENAI_API_KEY=sk-...", 'api_key = "your-api-key-here"', "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "GITHUB_TOKEN=<YOUR_TOKEN>",
    "token: ${{ secrets.GITHUB_TOKEN }}", "password: changeme", "DB_PASSWORD=${DB_PASSWORD}", 'api_key = os.environ["API_KEY"]',
    "const apiKey = process.env.OPENAI_API_KEY;", "Authorization: Bearer <token>", "Authorization: Bearer $ACCESS_TOKEN",
    'stripe.api_key = "sk_test_4eC39HqLyjWDarjtT1zdp7dc"', "GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "SLACK_BOT_TOKEN=xoxb-your-bot-token", "ANTHROPIC_API_KEY=sk-ant-api03-...", 'password = "password123"',
    "SECRET_KEY=changeme-in-production", "DATABASE_URL=postgres://user:password@localhost:5432/db",
    "MONGO_URI=mongodb+srv://<username>:<password>@cluster0.example.mongodb.net/test", "REDIS_URL=redis://localhost:6379/0",
    "ANTHROPIC_API_KEY=your-anthropic-key", "HF_TOKEN=hf_...", "export OPENAI_API_KEY='sk-proj-...'",
    '"password": ""', "password_min_length: 12", "max_tokens: 4096", "token_count = 512", "SECRET_KEY_FILE=/run/secrets/django_secret_key",
    'api_key_header = "X-API-Key"', "PASSWORD_RESET_URL=https://app.internal/reset", "  password: !vault |",
    "password = getpass.getpass()", 'token = request.headers.get("Authorization")', "password: {{ .Values.db.password }}",
    "GOOGLE_API_KEY=AIzaSyXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", "STRIPE_SECRET_KEY=sk_live_...", "TWILIO_AUTH_TOKEN=your_auth_token",
    "amqp://guest:guest@localhost:5672/", "mysql -u root -p", "docker login --password-stdin", 'client_secret: "<YOUR_CLIENT_SECRET>"',
    "curl -H 'Authorization: Bearer YOUR_API_KEY' https://api.internal/v1/models", "private_key_path: /etc/ssl/private/server.key",
    'tokenizer_name = "bert-base-uncased"', "secretName: app-tls-secret", "password=", "DB_PASSWORD=", "api_key: null",
    "AZURE_OPENAI_API_KEY=<key>", "password = ********", "jdbc:mysql://localhost:3306/shop?useSSL=false", "postgres://postgres:postgres@localhost:5432/dev",
]


def hard_negative(g):
    """One line that a scanner must not flag."""
    k = g.r.randrange(36)
    if k >= 30:
        return g.r.choice(CODE_NEGATIVES)
    if k >= 22:
        return more_negatives(g, k - 22)
    h = lambda n: g.s(HEX, n)
    if k == 0:
        return f"request_id={g.uuid4()} tenant={g.uuid4()} status=200"
    if k == 1:
        return f"commit {h(40)}\nMerge: {h(7)} {h(7)}"
    if k == 2:
        return f"sha256:{h(64)}"
    if k == 3:
        return f'"integrity": "sha512-{base64.b64encode(g.bytes_(64)).decode()}"'
    if k == 4:
        return f'<img alt="chart" src="{png_data_uri(g)}">'
    if k == 5:
        return f"image: registry.internal/app@sha256:{h(64)}"
    if k in (6, 7, 8):
        return g.r.choice(PLACEHOLDERS)
    if k == 9:
        return JWT_IO
    if k == 10:
        body = base64.b64encode(b"\x30\x82\x01\x22" + g.bytes_(270)).decode()
        return "-----BEGIN PUBLIC KEY-----\n" + "\n".join(body[i:i + 64] for i in range(0, len(body), 64)) + "\n-----END PUBLIC KEY-----"
    if k == 11:
        return f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{base64.b64encode(g.bytes_(32)).decode()[:43]} dev@laptop"
    if k == 12:
        return f"STRIPE_PUBLISHABLE_KEY=pk_live_{g.mixed(ALNUM, 99)}"
    if k == 13:
        return f'client_id = "{g.r.randint(10 ** 11, 10 ** 12)}-{g.s(LOWER_ALNUM, 32)}.apps.googleusercontent.com"'
    if k == 14:
        return f"arn:aws:iam::{g.r.randint(10 ** 11, 10 ** 12)}:role/{identifier(g)}"
    if k == 15:
        return f"{identifier(g)} = {identifier(g)}({identifier(g)})"
    if k == 16:
        return f"md5: {h(32)}  etag: \"{h(32)}\""
    if k == 17:
        return f"TWILIO_ACCOUNT_SID=AC{h(32)}"
    if k == 18:
        return f"color: #{h(6)}; version: {g.r.randint(0, 9)}.{g.r.randint(0, 40)}.{g.r.randint(0, 99)}; ip: 10.{g.r.randint(0, 255)}.{g.r.randint(0, 255)}.{g.r.randint(1, 254)}"
    if k == 19:
        cert = base64.b64encode(b"\x30\x82\x03\x5d\x30\x82\x02\x45" + g.bytes_(400)).decode()
        return "-----BEGIN CERTIFICATE-----\n" + "\n".join(cert[i:i + 64] for i in range(0, len(cert), 64)) + "\n-----END CERTIFICATE-----"
    if k == 20:
        return f"nonce={g.mixed(ALNUM, 32)} cache_key={h(40)} etag={h(16)}"
    # An unsigned (alg: none) JWT is not a credential.
    t = jwt(g).split(".")
    return f"{t[0]}.{t[1]}."


def more_negatives(g, k):
    h = lambda n: g.s(HEX, n)
    b64 = lambda n: base64.b64encode(g.bytes_(n)).decode()
    return [
        lambda: f'"token_type": "Bearer", "expires_in": 3600, "scope": "read", "password_hash": "{h(64)}"',
        lambda: f"fingerprint: SHA256:{b64(32).rstrip('=')}  kid: {h(16)}",
        lambda: f"oid sha256:{h(64)}\nsize {g.r.randint(1000, 10 ** 7)}",
        lambda: f"x-amz-request-id: {g.s('0123456789ABCDEF', 16)}\nx-amz-id-2: {b64(48)}",
        lambda: f"golang.org/x/net v0.{g.r.randint(1, 30)}.0 h1:{b64(32)}",
        lambda: f'valueFrom:\n  secretKeyRef:\n    name: {identifier(g).lower()}\n    key: password',
        lambda: g.r.choice(["Tokens prefixed with ghp_ are classic personal access tokens; rotate them.",
                            "Ключи OpenAI начинаются с sk-proj-, их нельзя публиковать.",
                            "Set STRIPE_SECRET_KEY to your sk_live_ key in the dashboard, never in code.",
                            "The header looks like Authorization: Bearer followed by the token.",
                            "Пароль должен быть длиной не менее 12 символов: password_min_length = 12."]),
        lambda: f'Content-Transfer-Encoding: base64\n\n{b64(240)}',
    ][k]()
